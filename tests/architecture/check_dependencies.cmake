# The dependency rules of docs/architecture.md ("Folders and their dependencies"), read from its
# table and checked on the sources: every `#include "<folder>/..."` of a folder's files and every tally_* library its
# CMake target links must be in that folder's row. Usage:
#   cmake -DSOURCE_DIR=<repository root> -P check_dependencies.cmake
# Exits with an error listing every violation.
cmake_minimum_required(VERSION 3.25)

# What each folder may use, read from the table of docs/architecture.md, the one statement of it:
# in each row "| `folder/` | holds | may depend on |", the backticked folders ("`topologies`") and
# single headers ("`topologies/parallel_config.h`") of the last column, and "`x/`" for everything x's row
# allows. Rows of folders without a CMakeLists.txt (adapters/) are not C++.
file(STRINGS "${SOURCE_DIR}/docs/architecture.md" table_rows REGEX "^\\| `[a-z_]+/` \\|")
set(folders "")
foreach(row IN LISTS table_rows)
  if(NOT row MATCHES "^\\| `([a-z_]+)/` \\|[^|]*\\|([^|]*)\\|$")
    message(FATAL_ERROR "docs/architecture.md: a dependency row of another form than | `folder/` | holds | may depend on |: ${row}")
  endif()
  set(folder "${CMAKE_MATCH_1}")
  set(uses "${CMAKE_MATCH_2}")
  if(NOT EXISTS "${SOURCE_DIR}/${folder}/CMakeLists.txt")
    continue()
  endif()
  list(APPEND folders "${folder}")
  set(allowed_${folder} "")
  string(REGEX MATCHALL "`[a-z_]+(/[a-z_]+\\.h|/)?`" tokens "${uses}")
  foreach(token IN LISTS tokens)
    string(REPLACE "`" "" token "${token}")
    if(token MATCHES "^([a-z_]+)/$")
      if(NOT DEFINED allowed_${CMAKE_MATCH_1})
        message(FATAL_ERROR "docs/architecture.md: ${folder}/'s row refers to ${token}'s row, which comes later or does not exist")
      endif()
      list(APPEND allowed_${folder} ${allowed_${CMAKE_MATCH_1}})
    else()
      list(APPEND allowed_${folder} "${token}")
    endif()
  endforeach()
endforeach()
foreach(expected topologies record kernels io vocab comm casefile manifest gradnorm oracle run fuzz cli)
  if(NOT expected IN_LIST folders)
    message(FATAL_ERROR "docs/architecture.md: the dependency table has no row for ${expected}/")
  endif()
endforeach()

# The CMake targets a folder's libraries link, by folder; kernels' generator is its own target.
set(target_of_generator "kernels/gradient_generator.h")

set(violations "")
foreach(folder IN LISTS folders)
  set(allowed "${allowed_${folder}}")
  file(GLOB_RECURSE sources "${SOURCE_DIR}/${folder}/*.h" "${SOURCE_DIR}/${folder}/*.cpp"
       "${SOURCE_DIR}/${folder}/*.cu" "${SOURCE_DIR}/${folder}/*.cuh")
  foreach(source IN LISTS sources)
    file(STRINGS "${source}" includes REGEX "^#include \"[a-z_]+/")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^#include \"([a-z_]+)/([^\"]+)\".*" "\\1" used "${line}")
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" header "${line}")
      if(used STREQUAL folder OR NOT used IN_LIST folders)
        continue()
      endif()
      if(NOT used IN_LIST allowed AND NOT header IN_LIST allowed)
        file(RELATIVE_PATH shown "${SOURCE_DIR}" "${source}")
        list(APPEND violations "${shown} includes ${header}: ${folder}/ may not use ${used}/")
      endif()
    endforeach()
  endforeach()

  # The libraries the folder's targets link.
  file(READ "${SOURCE_DIR}/${folder}/CMakeLists.txt" cmake_text)
  string(REGEX MATCHALL "target_link_libraries\\(tally_[a-z_]+[^)]*\\)" link_calls "${cmake_text}")
  foreach(call IN LISTS link_calls)
    string(REGEX MATCHALL "tally_[a-z_]+" targets "${call}")
    list(POP_FRONT targets self)
    foreach(target IN LISTS targets)
      string(REGEX REPLACE "^tally_" "" linked "${target}")
      if(linked STREQUAL "warnings" OR linked STREQUAL folder OR target STREQUAL self)
        continue()
      endif()
      if(linked STREQUAL "generator")
        if(NOT folder STREQUAL "kernels" AND NOT "kernels" IN_LIST allowed AND NOT target_of_generator IN_LIST allowed)
          list(APPEND violations "${folder}/CMakeLists.txt: ${self} links ${target}")
        endif()
        continue()
      endif()
      # A single-header allowance of a folder permits no link to that folder's library, except
      # casefile/ -> gradnorm (its option types' names) and manifest/ -> casefile (strict JSON).
      if(NOT linked IN_LIST allowed AND NOT (folder STREQUAL "casefile" AND linked STREQUAL "gradnorm")
         AND NOT (folder STREQUAL "manifest" AND linked STREQUAL "casefile"))
        list(APPEND violations "${folder}/CMakeLists.txt: ${self} links ${target}: ${folder}/ may not use ${linked}/")
      endif()
    endforeach()
  endforeach()
endforeach()

if(violations)
  list(JOIN violations "\n  " shown)
  message(FATAL_ERROR "dependency rules of docs/architecture.md broken:\n  ${shown}")
endif()
message(STATUS "every include and link follows docs/architecture.md")
