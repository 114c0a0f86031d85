# The layers run one way: tools -> python -> client -> kernels -> snapshot ->
# io, and daemon -> kernels -> snapshot -> io (kernels use the shard format's
# chunk codec and hashes), with proto below client and daemon. Nothing under
# client/ (libckpt, linked into trainers) includes daemon code, and tools/
# reads the daemon through daemon/api/ only (but for the benchmark of the
# coordinator's backends themselves). Inside daemon/, the subsystems run one
# way too: api -> server -> service -> publish -> peer -> (persist, memory,
# health, coord) -> catalog -> common (health reads coord's tier names). Run as a
# test:
#   cmake -DSOURCE_DIR=<repo> -P cmake/check_layers.cmake
# It fails naming every file and line whose include crosses a layer upward.
cmake_minimum_required(VERSION 3.20)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "check_layers.cmake: pass -DSOURCE_DIR=<repository root>")
endif()

# What each layer's files may include of the project's own directories.
set(allowed_io       io)
set(allowed_snapshot snapshot io proto)
set(allowed_kernels  kernels snapshot io proto)
set(allowed_daemon   daemon kernels snapshot io proto)
set(allowed_client   client kernels snapshot io proto)
set(allowed_python   python client kernels snapshot io proto)
set(allowed_tools    tools client daemon kernels snapshot io proto)
# tools/ files that drive a daemon part itself rather than read ckptd's state.
set(tools_daemon_internals tools/ckpt_bench_control_plane.cc)
set(project_dirs io snapshot kernels proto daemon client python tools tests)

# What each daemon subsystem may include of daemon/ (ARCHITECTURE.md).
set(daemon_common  common)
set(daemon_catalog catalog common)
set(daemon_coord   coord catalog common)
set(daemon_memory  memory common)
set(daemon_persist persist common)
set(daemon_health  health coord catalog common)
set(daemon_peer    peer persist coord catalog common)
set(daemon_publish publish peer persist coord catalog common)
set(daemon_service service peer publish persist memory health coord catalog common)
set(daemon_server  server service peer publish persist memory health coord catalog common)
set(daemon_api     api server service peer publish persist memory health coord catalog common)
set(daemon_parts common catalog coord memory persist health peer publish service server api)

set(violations "")
foreach(layer io snapshot kernels daemon client python tools)
  file(GLOB_RECURSE files RELATIVE "${SOURCE_DIR}"
       "${SOURCE_DIR}/${layer}/*.h" "${SOURCE_DIR}/${layer}/*.cc"
       "${SOURCE_DIR}/${layer}/*.cu" "${SOURCE_DIR}/${layer}/*.cuh")
  foreach(f IN LISTS files)
    file(STRINGS "${SOURCE_DIR}/${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(line IN LISTS lines)
      string(REGEX MATCH "\"([a-z_]+)/" _ "${line}")
      set(dir "${CMAKE_MATCH_1}")
      if(dir STREQUAL "" OR NOT dir IN_LIST project_dirs)
        continue()
      endif()
      if(NOT dir IN_LIST allowed_${layer})
        string(STRIP "${line}" line)
        string(APPEND violations
               "\n  ${f}: ${line} (${layer}/ may include only: ${allowed_${layer}})")
      elseif(layer STREQUAL "tools" AND dir STREQUAL "daemon")
        string(REGEX MATCH "\"daemon/([a-z_]+)/" _ "${line}")
        set(target "${CMAKE_MATCH_1}")
        string(STRIP "${line}" line)
        if(NOT target STREQUAL "api" AND NOT f IN_LIST tools_daemon_internals)
          string(APPEND violations
                 "\n  ${f}: ${line} (tools/ reads the daemon through daemon/api/ only)")
        endif()
      elseif(layer STREQUAL "daemon" AND dir STREQUAL "daemon")
        # A daemon file lies in a subsystem's folder and includes only the
        # subsystems below its own.
        string(REGEX MATCH "^daemon/([a-z_]+)/" _ "${f}")
        set(part "${CMAKE_MATCH_1}")
        string(REGEX MATCH "\"daemon/([a-z_]+)/" _ "${line}")
        set(target "${CMAKE_MATCH_1}")
        string(STRIP "${line}" line)
        if(NOT part IN_LIST daemon_parts)
          string(APPEND violations
                 "\n  ${f}: not in a subsystem's folder (daemon/: ${daemon_parts})")
        elseif(NOT target IN_LIST daemon_${part})
          string(APPEND violations
                 "\n  ${f}: ${line} (daemon/${part}/ may include only: ${daemon_${part}})")
        endif()
      endif()
    endforeach()
  endforeach()
endforeach()

if(violations)
  message(FATAL_ERROR "includes that cross a layer upward:${violations}")
endif()
message(STATUS "layers: every include runs one way")
