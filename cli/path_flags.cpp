#include "cli/path_flags.h"

#include <filesystem>

namespace tally::cli {

namespace fs = std::filesystem;

namespace {

fs::file_type type_of(const fs::path& path) {
  std::error_code ec;
  return fs::status(path, ec).type();
}

}  // namespace

std::optional<std::string> output_file_error(std::string_view text) {
  if (text.empty()) return "expected a file path, got ''";
  const fs::path path(text);
  const fs::file_type type = type_of(path);
  if (type == fs::file_type::directory) return std::string(text) + " is a folder, not a file";
  if (type != fs::file_type::not_found && type != fs::file_type::regular)
    return std::string(text) + " exists and is not a regular file";
  const fs::path folder = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  if (type_of(folder) != fs::file_type::directory)
    return "the folder " + folder.string() + " of " + std::string(text) + " does not exist";
  return std::nullopt;
}

std::optional<std::string> output_folder_error(std::string_view text) {
  if (text.empty()) return "expected a folder path, got ''";
  fs::path path(text);
  const fs::file_type type = type_of(path);
  if (type == fs::file_type::directory) return std::nullopt;
  if (type != fs::file_type::not_found) return std::string(text) + " exists and is not a folder";
  // Created when first needed: every existing ancestor must be a folder.
  for (fs::path up = path.parent_path(); !up.empty(); up = up.parent_path()) {
    const fs::file_type t = type_of(up);
    if (t == fs::file_type::directory) return std::nullopt;
    if (t != fs::file_type::not_found)
      return "cannot create " + std::string(text) + ": " + up.string() + " is not a folder";
    if (up == up.parent_path()) break;
  }
  return std::nullopt;
}

CLI::Validator output_file() {
  return CLI::Validator([](std::string& text) { return output_file_error(text).value_or(""); },
                        "FILE");
}

CLI::Validator output_folder() {
  return CLI::Validator([](std::string& text) { return output_folder_error(text).value_or(""); },
                        "FOLDER");
}

}  // namespace tally::cli
