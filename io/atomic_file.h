// Writing a file so that a reader, or a crash, never sees it partial: a temporary file in the
// same folder, written, fsync'ed, then renamed over the target (and the folder fsync'ed).
#pragma once

#include <string>
#include <string_view>

namespace tally::io {

// Throws std::runtime_error "FILE: cannot write the <noun> (<step>: <errno text>)"; the
// temporary file is removed on failure.
// The temporary file is ".<name>.tmp.<pid>.XXXXXX": the pid of the process writing it.
void write_file_atomically(const std::string& file, std::string_view text, std::string_view noun);

// Removes, directly in `folder`, the temporary files of write_file_atomically whose process is gone
// (a run killed mid-write leaves one); returns how many. A folder that cannot be read removes none.
int remove_orphaned_temporaries(const std::string& folder);

}  // namespace tally::io
