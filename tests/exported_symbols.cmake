# Run with cmake -P -DLIBRARY=<libtorchdefer.so>: the dynamic symbol table holds the public API
# (materialize_module, the DeferredInitGuard deferred_init opens), what the Python extension uses
# (RecordingScope, torchdefer/extension.h) and nothing of torchdefer::detail.
find_program(NM nm REQUIRED)
execute_process(COMMAND "${NM}" -D --defined-only -C "${LIBRARY}"
                OUTPUT_VARIABLE symbols RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "nm failed (${result}) on ${LIBRARY}")
endif()
foreach(required "torchdefer::materialize_module(" "torchdefer::DeferredInitGuard::DeferredInitGuard("
                 "torchdefer::RecordingScope::RecordingScope(" "torchdefer::is_fake(")
  string(FIND "${symbols}" "${required}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${LIBRARY} does not export ${required}")
  endif()
endforeach()
string(REGEX MATCHALL "[^\n]*torchdefer::detail[^\n]*" internals "${symbols}")
if(internals)
  string(REPLACE ";" "\n" internals "${internals}")
  message(FATAL_ERROR "${LIBRARY} exports internals:\n${internals}")
endif()
