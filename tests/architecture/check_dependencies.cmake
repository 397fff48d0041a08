# The dependency rules of docs/architecture.md ("Folders and their dependencies"), checked on the
# sources: every `#include "<folder>/..."` of a folder's files and every tally_* library its
# CMake target links must be in that folder's row. Usage:
#   cmake -DSOURCE_DIR=<repository root> -P check_dependencies.cmake
# Exits with an error listing every violation.
cmake_minimum_required(VERSION 3.25)

# What each folder may use: whole folders, or single headers ("folder/file.h").
set(allowed_topologies "")
set(allowed_record "")
set(allowed_kernels "")
set(allowed_comm "topologies")
set(allowed_gradnorm "topologies;record;kernels;comm")
set(allowed_oracle "topologies;record;kernels/gradient_generator.h;kernels/summation_order.h")
set(allowed_casefile "topologies;gradnorm/path_options.h;gradnorm/faults.h;gradnorm/optimizer_model.h;gradnorm/gradients.h")
set(allowed_manifest "record;topologies/parallel_config.h;casefile/json_read.h;casefile/atomic_file.h")
set(below_run "topologies;record;kernels;comm;gradnorm;oracle;casefile;manifest")
set(allowed_run "${below_run}")
set(allowed_fuzz "${below_run};run")
set(allowed_cli "${below_run};run;fuzz")
set(folders topologies record kernels comm gradnorm oracle casefile manifest run fuzz cli)

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
