// Output paths checked when the command line is parsed, before any work: a campaign must not
// run for an hour and then find that its report or corpus cannot be written.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace tally::cli {

// Why a file cannot be written at `path`: it is a folder or another non-regular file, or its
// folder does not exist (or is not a folder). nullopt when it can be tried.
std::optional<std::string> output_file_error(std::string_view path);
// Why a folder cannot be used or created at `path`: it exists and is not a folder, or its
// nearest existing ancestor is not a folder.
std::optional<std::string> output_folder_error(std::string_view path);

CLI::Validator output_file();
CLI::Validator output_folder();

}  // namespace tally::cli
