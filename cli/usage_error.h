// Errors a user causes: the command prints the message on one line and exits 2.
#pragma once

#include <stdexcept>

namespace tally::cli {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kExitPass = 0;
inline constexpr int kExitFail = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInfra = 3;

}  // namespace tally::cli
