# Install rules and the package config, so that a downstream project can write
#   find_package(torchdefer REQUIRED)
#   target_link_libraries(app PRIVATE torchdefer::torchdefer)
include(CMakePackageConfigHelpers)

set(TORCHDEFER_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/torchdefer")

install(TARGETS torchdefer EXPORT torchdeferTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The public headers: every layer's include/ (recorder/ has none, Note [Who reads values]) and the
# generated version.h. docs/design.md's table of them is generated from these folders
# (scripts/check_docs.py).
install(DIRECTORY core/include/ replay/include/ api/include/ "${PROJECT_BINARY_DIR}/include/"
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT torchdeferTargets NAMESPACE torchdefer:: DESTINATION ${TORCHDEFER_CMAKE_DIR})

configure_package_config_file(cmake/torchdeferConfig.cmake.in
  "${PROJECT_BINARY_DIR}/torchdeferConfig.cmake"
  INSTALL_DESTINATION ${TORCHDEFER_CMAKE_DIR})
write_basic_package_version_file("${PROJECT_BINARY_DIR}/torchdeferConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES
  "${PROJECT_BINARY_DIR}/torchdeferConfig.cmake"
  "${PROJECT_BINARY_DIR}/torchdeferConfigVersion.cmake"
  DESTINATION ${TORCHDEFER_CMAKE_DIR})
