# Makes DEST (build/python/torchdefer) hold SOURCE's Python files: copies them, and removes the
# .py and .pyi files SOURCE no longer has (a module renamed or deleted would otherwise stay
# importable from the build). _build_info.py is generated into DEST, not copied.
file(GLOB built RELATIVE "${DEST}" "${DEST}/*.py" "${DEST}/*.pyi")
foreach(file IN LISTS built)
  if(NOT EXISTS "${SOURCE}/${file}" AND NOT file STREQUAL "_build_info.py")
    file(REMOVE "${DEST}/${file}")
  endif()
endforeach()
file(COPY "${SOURCE}/" DESTINATION "${DEST}")
