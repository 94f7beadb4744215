# Writes DST (loom_version.h) from SRC with the commit the sources are at, at every build, and
# touches it only when that changes: `loom --version` names the commit it was built from, not the
# one the build directory was configured at. Inputs: SRC, DST, SOURCE_DIR, PROJECT_VERSION and
# GIT_EXECUTABLE (empty: not a git checkout, or no git).
set(LOOM_GIT_COMMIT "")
if(GIT_EXECUTABLE)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE LOOM_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(LOOM_GIT_COMMIT)
    # tracked files changed since that commit: the binary is not that commit's
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(changes)
      string(APPEND LOOM_GIT_COMMIT "-modified")
    endif()
  endif()
endif()
configure_file(${SRC} ${DST} @ONLY)
