#include <iostream>

#include "cli/commands.h"

int main(int argc, char** argv) { return tally::cli::run_tally(argc, argv, std::cout, std::cerr); }
