// Writing a file so that a reader, or a crash, never sees it partial: a temporary file in the
// same folder, written, fsync'ed, then renamed over the target (and the folder fsync'ed).
#pragma once

#include <string>
#include <string_view>

namespace tally::io {

// Throws std::runtime_error "FILE: cannot write the <noun> (<step>: <errno text>)"; the
// temporary file is removed on failure.
void write_file_atomically(const std::string& file, std::string_view text, std::string_view noun);

}  // namespace tally::io
