# Writes OUT (a header defining HOSTKV_COMMIT) from `git describe` of SRC at
# build time, rewriting it only when the commit changed. Without git or a
# checkout (a source tarball, an image build without .git), the commit is
# HOSTKV_COMMIT from the environment, or "unknown".
execute_process(
  COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE failed ERROR_QUIET)
if(failed OR commit STREQUAL "")
  if(DEFINED ENV{HOSTKV_COMMIT} AND NOT "$ENV{HOSTKV_COMMIT}" STREQUAL "")
    set(commit "$ENV{HOSTKV_COMMIT}")
  else()
    set(commit "unknown")
  endif()
endif()
set(text "#define HOSTKV_COMMIT \"${commit}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
