# Shared by every distribution's CMakeLists.txt: where the pinned llama.cpp tree is,
# and the settings every native part of llamaplug is built with.
get_filename_component(LLAMAPLUG_REPO "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

# SKBUILD_SABI_COMPONENT is Development.SABIModule where the wheel is abi3 (the core), empty otherwise.
find_package(Python COMPONENTS Interpreter Development.Module ${SKBUILD_SABI_COMPONENT} REQUIRED)

function(llamaplug_pin key out_var)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${LLAMAPLUG_REPO}/vendor/llama.cpp/fetch.py" --pin ${key}
    OUTPUT_VARIABLE value OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  set(${out_var} "${value}" PARENT_SCOPE)
endfunction()

# Materialises the pinned tree (or takes LLAMAPLUG_LLAMA_CPP_DIR) and returns its path.
function(llamaplug_llama_cpp_dir out_var)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" "${LLAMAPLUG_REPO}/vendor/llama.cpp/fetch.py"
    OUTPUT_VARIABLE dir ERROR_VARIABLE err RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "llamaplug: could not materialise the pinned llama.cpp tree:\n${err}")
  endif()
  set(${out_var} "${dir}" PARENT_SCOPE)
endfunction()

llamaplug_pin(commit LLAMAPLUG_LLAMA_CPP_COMMIT)
llamaplug_pin(ggml_version LLAMAPLUG_GGML_VERSION)

find_program(LLAMAPLUG_CCACHE ccache)
if(LLAMAPLUG_CCACHE AND NOT CMAKE_C_COMPILER_LAUNCHER)
  set(CMAKE_C_COMPILER_LAUNCHER "${LLAMAPLUG_CCACHE}")
  set(CMAKE_CXX_COMPILER_LAUNCHER "${LLAMAPLUG_CCACHE}")
endif()

# One shared library build, no compute backend linked in: backends are modules.
set(BUILD_SHARED_LIBS ON CACHE BOOL "" FORCE)
set(GGML_BACKEND_DL ON CACHE BOOL "" FORCE)
set(GGML_NATIVE OFF CACHE BOOL "" FORCE)
set(LLAMA_BUILD_COMMIT "${LLAMAPLUG_LLAMA_CPP_COMMIT}" CACHE STRING "" FORCE)
set(GGML_BUILD_COMMIT "${LLAMAPLUG_LLAMA_CPP_COMMIT}" CACHE STRING "" FORCE)

# Unversioned sonames: wheels cannot hold symlinks, and every llamaplug library
# finds its siblings by rpath, never on the system.
function(llamaplug_unversion)
  foreach(target IN LISTS ARGN)
    set_property(TARGET ${target} PROPERTY VERSION)
    set_property(TARGET ${target} PROPERTY SOVERSION)
  endforeach()
endfunction()

# Writes the pin next to a distribution's Python code, so the core can refuse
# a backend module built from another llama.cpp.
function(llamaplug_write_build_info destination)
  set(info "${CMAKE_CURRENT_BINARY_DIR}/_build_info.py")
  file(WRITE "${info}" "# Written by the build.\nLLAMA_CPP_COMMIT = \"${LLAMAPLUG_LLAMA_CPP_COMMIT}\"\nGGML_VERSION = \"${LLAMAPLUG_GGML_VERSION}\"\n${ARGN}")
  install(FILES "${info}" DESTINATION "${destination}")
endfunction()

# A backend module needs ggml-base only to link against: at run time it resolves to the core's copy. Where the
# build's Python already has the core of the same pin installed (pip --no-build-isolation after the core: make run,
# tox), the modules link that file and ggml-base is not compiled again (a third of the CPU plugin's build on
# 2 cores, issue 48). Otherwise (an isolated wheel build, an editable core) ggml-base is built as before.
function(llamaplug_link_core_ggml_base)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c [=[
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llamaplug")
if spec and spec.origin:
    here = pathlib.Path(spec.origin).parent
    info, lib = here / "_build_info.py", here / "lib" / "libggml-base.so"
    if lib.is_file() and info.is_file() and f'LLAMA_CPP_COMMIT = "{sys.argv[1]}"' in info.read_text():
        print(lib)
]=] "${LLAMAPLUG_LLAMA_CPP_COMMIT}"
    OUTPUT_VARIABLE lib OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR lib STREQUAL "")
    message(STATUS "llamaplug: no installed core of this pin: ggml-base is built here")
    return()
  endif()
  message(STATUS "llamaplug: linking the installed core's ggml-base: ${lib}")
  # GLOBAL: the modules' link lines are resolved in ggml's own directory. What ggml-base gives its users (the
  # public headers, GGML_BACKEND_DL and the like) the imported copy gives them too.
  add_library(llamaplug_core_ggml_base SHARED IMPORTED GLOBAL)
  # Its build-tree include folder spelled as ggml spells it: tests/test_build_parity.py compares the flags as text.
  get_target_property(defs ggml-base INTERFACE_COMPILE_DEFINITIONS)
  get_target_property(incs ggml-base INTERFACE_INCLUDE_DIRECTORIES)
  string(REGEX REPLACE "\\$<BUILD_INTERFACE:([^>]*)>" "\\1" incs "${incs}")
  string(REGEX REPLACE "\\$<INSTALL_INTERFACE:[^>]*>" "" incs "${incs}")
  list(REMOVE_ITEM incs "")
  set_target_properties(llamaplug_core_ggml_base PROPERTIES IMPORTED_LOCATION "${lib}"
    INTERFACE_INCLUDE_DIRECTORIES "${incs}" INTERFACE_COMPILE_DEFINITIONS "${defs}" SYSTEM FALSE)
  foreach(target IN LISTS ARGN)
    get_target_property(libs ${target} LINK_LIBRARIES)
    list(TRANSFORM libs REPLACE "^ggml-base$" llamaplug_core_ggml_base)
    set_target_properties(${target} PROPERTIES LINK_LIBRARIES "${libs}")
  endforeach()
endfunction()

# The whole CMakeLists.txt of a backend plugin: builds ggml's <option> backend
# (GGML_<option>=ON) from the pinned tree as the module target <target>, and
# installs it into <package>/lib next to the plugin's Python code.
macro(llamaplug_backend_module option target package)
  llamaplug_llama_cpp_dir(LLAMA_CPP_DIR)
  set(GGML_CPU OFF CACHE BOOL "" FORCE)
  set(GGML_${option} ON CACHE BOOL "" FORCE)
  # llama.cpp's own CMakeLists turns CUDA graphs on before it adds ggml; a plugin adds ggml directly, where the
  # default is off, and a CUDA module without graphs launched every kernel of every token on its own
  # (tg 0.45x native on an H100, docs/benchmarks.md).
  if(NOT DEFINED GGML_CUDA_GRAPHS)
    set(GGML_CUDA_GRAPHS ON CACHE BOOL "" FORCE)
  endif()
  add_subdirectory("${LLAMA_CPP_DIR}/ggml" ggml EXCLUDE_FROM_ALL)
  llamaplug_link_core_ggml_base(${target})
  llamaplug_unversion(ggml-base ${target})
  # ggml-base resolves to the core's copy: same pin, same soname, already loaded.
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/../../llamaplug/lib")
  add_custom_target(backend_modules ALL DEPENDS ${target})
  install(TARGETS ${target} LIBRARY DESTINATION ${package}/lib)
  llamaplug_write_build_info(${package})
endmacro()
