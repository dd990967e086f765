# `cmake -P cmake/cmake_command.cmake` prints the path of cmake's own binary (CMAKE_COMMAND), past any wrapper.
message("${CMAKE_COMMAND}")
