# `cmake --install`: headers, libraries, tools, the Python package and an
# exported CMake package, so that another project does
#
#   find_package(NSA CONFIG REQUIRED)   # -DNSA_DIR=<prefix>/lib/cmake/nsa
#   target_link_libraries(app PRIVATE NSA::NSAPipelines)   # C++
#   target_link_libraries(app PRIVATE NSA::NSA-C)          # C API
#   target_link_libraries(app PRIVATE NSA::nsa_runtime)    # GPU runtime
#
# (examples/embedding does all three; docs/Embedding.md).
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

set(NSA_INSTALL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/nsa)

set(NSA_INSTALL_TARGETS NSADialect NSATransforms NSAToCPU NSAToGPU NSAToPTX
  NSAPipelines NSAReference NSACPURunner nsa_error nsa_reference NSA-C
  NSAPlugin)
if(TARGET nsa_runtime)
  list(APPEND NSA_INSTALL_TARGETS nsa_runtime nsa_runtime_static)
endif()
if(TARGET nsa_layers)
  list(APPEND NSA_INSTALL_TARGETS nsa_layers)
endif()
install(TARGETS ${NSA_INSTALL_TARGETS} nsa-opt nsa-gen-layer nsa-reach
  EXPORT NSATargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(DIRECTORY include/NSA include/NSA-c
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h" PATTERN "*.td")
install(DIRECTORY ${PROJECT_BINARY_DIR}/include/NSA
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.inc")
# The C++ JIT runner and the reference, included as "CPURunner.h".
install(FILES runtime/cpu/CPURunner.h runtime/reference/NSAReference.h
  runtime/reference/LayerDesc.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/NSA/CPU)

install(EXPORT NSATargets NAMESPACE NSA::
  DESTINATION ${NSA_INSTALL_CMAKE_DIR})
configure_package_config_file(cmake/NSAConfig.cmake.in
  ${PROJECT_BINARY_DIR}/NSAConfig.cmake
  INSTALL_DESTINATION ${NSA_INSTALL_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/NSAConfigVersion.cmake
  VERSION 0.1.0 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/NSAConfig.cmake
  ${PROJECT_BINARY_DIR}/NSAConfigVersion.cmake cmake/NSALayers.cmake
  DESTINATION ${NSA_INSTALL_CMAKE_DIR})

# The Python package, beside the libraries it loads (python/CMakeLists.txt).
install(DIRECTORY ${PROJECT_BINARY_DIR}/lib/python/nsa
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/python
  PATTERN "__pycache__" EXCLUDE)
