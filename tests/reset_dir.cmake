# cmake -DDIR=<dir> -P reset_dir.cmake: DIR emptied (created if missing). The tests' temporary directory.
if(NOT DIR)
  message(FATAL_ERROR "reset_dir.cmake: DIR is not set")
endif()
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
