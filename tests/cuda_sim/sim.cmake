# tests/cuda_sim/sim.cmake — included by the top-level CMakeLists when
# MPITRON_CUDA_SIM=ON: every target sees the simulated device's headers before
# the toolkit's, and (by default) the whole build runs under AddressSanitizer.
option(MPITRON_CUDA_SIM_ASAN "Build the simulated-device configuration with AddressSanitizer" ON)
message(STATUS "mpitron: CUDA backend on the SIMULATED device (tests/cuda_sim), AddressSanitizer ${MPITRON_CUDA_SIM_ASAN}")
add_compile_definitions(MPITRON_CUDA_SIM=1)
include_directories(BEFORE ${CMAKE_SOURCE_DIR}/tests/cuda_sim/include)
if(MPITRON_CUDA_SIM_ASAN)
  add_compile_options(-fsanitize=address -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address)
endif()
add_link_options(-rdynamic)  # function names in the race check's allocation sites without AddressSanitizer
add_subdirectory(${CMAKE_SOURCE_DIR}/tests/cuda_sim ${CMAKE_BINARY_DIR}/cuda_sim)
