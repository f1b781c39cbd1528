# Checks the includes of src/ and include/holdfast/ against the layer
# rules (cmake/layers.cmake), and docs/architecture.md's layer table
# against the same rules. Fails naming each include that breaks a rule.
#
#   cmake -DSOURCE_DIR=<checkout> [-DWRITE_TABLE=<file>] \
#         -P cmake/check_layers.cmake
# WRITE_TABLE: also writes the table the rules make, for the docs.
cmake_minimum_required(VERSION 3.22)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "check_layers: pass -DSOURCE_DIR=<checkout>")
endif()
include(${SOURCE_DIR}/cmake/layers.cmake)
set(errors "")

# The layer a public header belongs to.
foreach(layer ${HOLDFAST_LAYERS})
  foreach(h ${HOLDFAST_HEADERS_${layer}})
    set(header_layer_${h} ${layer})
  endforeach()
endforeach()
file(GLOB_RECURSE public RELATIVE ${SOURCE_DIR}/include/holdfast
     ${SOURCE_DIR}/include/holdfast/*.h ${SOURCE_DIR}/include/holdfast/*.h.in)
foreach(h ${public})
  string(REGEX REPLACE "\\.in$" "" name ${h})
  if(NOT DEFINED header_layer_${name})
    string(APPEND errors "  include/holdfast/${h}: no layer claims it "
           "(HEADERS in cmake/layers.cmake)\n")
  endif()
endforeach()

# The layer whose directory holds src/<path> (the longest name that
# matches), or "" for none.
function(layer_of_src path out)
  set(best "")
  foreach(layer ${HOLDFAST_LAYERS})
    string(LENGTH "${layer}" n)
    string(LENGTH "${best}" m)
    if(path MATCHES "^${layer}/[^/]+$" AND n GREATER m)
      set(best ${layer})
    endif()
  endforeach()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

# Whether `layer` may include the public headers of `other`.
function(may_use_api layer other out)
  set(ok OFF)
  if(other STREQUAL layer OR other IN_LIST HOLDFAST_USES_${layer} OR
     other IN_LIST HOLDFAST_API_${layer})
    set(ok ON)
  endif()
  set(${out} ${ok} PARENT_SCOPE)
endfunction()

# Every include of `file` (of `layer`) against the rules.
function(check_file file layer)
  file(STRINGS ${SOURCE_DIR}/${file} lines REGEX "^#include \"(holdfast|src)/")
  foreach(line ${lines})
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" inc "${line}")
    if(inc MATCHES "^holdfast/(.*)$")
      set(h ${CMAKE_MATCH_1})
      if(NOT DEFINED header_layer_${h})
        continue()  # reported above, or not a header of the tree
      endif()
      may_use_api(${layer} ${header_layer_${h}} ok)
      if(NOT ok)
        string(APPEND errors "  ${file}: includes ${inc} (layer "
               "${header_layer_${h}}), which layer ${layer} may not use\n")
      endif()
    elseif(inc MATCHES "^src/(.*)$")
      layer_of_src(${CMAKE_MATCH_1} other)
      if(NOT other STREQUAL layer AND NOT other IN_LIST HOLDFAST_USES_${layer})
        string(APPEND errors "  ${file}: includes ${inc} (layer "
               "'${other}'), which layer ${layer} may not use\n")
      endif()
    endif()
  endforeach()
  set(errors "${errors}" PARENT_SCOPE)
endfunction()

foreach(layer ${HOLDFAST_LAYERS})
  file(GLOB files RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/src/${layer}/*.h
       ${SOURCE_DIR}/src/${layer}/*.cc ${SOURCE_DIR}/src/${layer}/*.c)
  foreach(f ${files})
    check_file(${f} ${layer})
  endforeach()
  foreach(h ${HOLDFAST_HEADERS_${layer}})
    set(path include/holdfast/${h})
    if(NOT EXISTS ${SOURCE_DIR}/${path})
      set(path ${path}.in)
    endif()
    if(EXISTS ${SOURCE_DIR}/${path})
      check_file(${path} ${layer})
    else()
      string(APPEND errors "  cmake/layers.cmake: ${layer} claims "
             "include/holdfast/${h}, which does not exist\n")
    endif()
  endforeach()
endforeach()

# Every directory of src/ with sources belongs to a layer.
file(GLOB_RECURSE all RELATIVE ${SOURCE_DIR}/src ${SOURCE_DIR}/src/*.h
     ${SOURCE_DIR}/src/*.cc ${SOURCE_DIR}/src/*.c)
foreach(f ${all})
  layer_of_src(${f} layer)
  if(layer STREQUAL "")
    string(APPEND errors "  src/${f}: in no layer (cmake/layers.cmake)\n")
  endif()
endforeach()

# docs/architecture.md's table, between its markers, is the rules.
set(want "| layer | may use | public headers (include/holdfast/) |\n")
string(APPEND want "| --- | --- | --- |\n")
foreach(layer ${HOLDFAST_LAYERS})
  set(uses ${HOLDFAST_USES_${layer}})
  foreach(a ${HOLDFAST_API_${layer}})
    list(APPEND uses "${a} (headers)")
  endforeach()
  list(JOIN uses ", " uses_text)
  list(JOIN HOLDFAST_HEADERS_${layer} ", " headers_text)
  if(uses_text STREQUAL "")
    set(uses_text "-")
  endif()
  if(headers_text STREQUAL "")
    set(headers_text "-")
  endif()
  string(APPEND want "| ${layer} | ${uses_text} | ${headers_text} |\n")
endforeach()
if(WRITE_TABLE)
  file(WRITE ${WRITE_TABLE} "${want}")
endif()
file(READ ${SOURCE_DIR}/docs/architecture.md doc)
string(REGEX MATCH "<!-- layers: begin -->\n(.*)<!-- layers: end -->" found
       "${doc}")
if(NOT found OR NOT CMAKE_MATCH_1 STREQUAL want)
  string(APPEND errors "  docs/architecture.md: the table between "
         "<!-- layers: begin --> and <!-- layers: end --> is not the rules of "
         "cmake/layers.cmake; it should read:\n${want}")
endif()

if(errors)
  message(FATAL_ERROR "layer check failed:\n${errors}")
endif()
message(STATUS "layer check: the includes of src/ and include/holdfast/ "
        "and docs/architecture.md keep the rules")
