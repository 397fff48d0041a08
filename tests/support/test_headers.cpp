// The translation unit tally_test_headers compiles its precompiled header with (tests/CMakeLists.txt):
// the headers every test parses, built once and reused by each test executable.
