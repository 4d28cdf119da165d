# Install rules and Debian packages (CPack). `cmake --install build --prefix /usr` puts the
# programs where the systemd units expect them; `cpack --config build/CPackConfig.cmake -G DEB`
# (run from the build folder) makes one package per component:
#   remat         the remat CLI, the Slurm prolog (libexec)       (component cli)
#   rematd        the coordinator, its unit, sysusers entry, /etc/default/rematd
#   remat-worker  the worker daemon, its unit, the Megatron Bridge metrics callback
#   remat-engine  remat-trial (LibTorch) for GPU nodes, separately: it is the heavy one
# deploy/README.md ("Packages") has the operator's commands; ctest deploy_packages checks them.
include(GNUInstallDirs)

set(REMAT_UNIT_DIR "lib/systemd/system")
set(REMAT_SYSUSERS_DIR "lib/sysusers.d")

if(TARGET remat)
  install(TARGETS remat RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
  # The Slurm trigger runs the CLI on the controller (deploy/README.md, "Slurm").
  install(PROGRAMS deploy/slurm/prolog-remat-submit.sh
          DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/remat COMPONENT cli)
endif()
if(TARGET rematd)
  install(TARGETS rematd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT rematd)
  install(FILES deploy/systemd/rematd.service DESTINATION ${REMAT_UNIT_DIR} COMPONENT rematd)
  install(FILES deploy/debian/sysusers.conf DESTINATION ${REMAT_SYSUSERS_DIR}
          RENAME remat.conf COMPONENT rematd)
  install(FILES deploy/debian/rematd.default DESTINATION /etc/default RENAME rematd
          COMPONENT rematd)
  install(FILES server/README.md deploy/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR}/../rematd
          COMPONENT rematd)
endif()
if(TARGET remat-worker)
  install(TARGETS remat-worker RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT worker)
  install(FILES deploy/systemd/remat-worker.service DESTINATION ${REMAT_UNIT_DIR}
          COMPONENT worker)
  install(FILES deploy/debian/sysusers.conf DESTINATION ${REMAT_SYSUSERS_DIR}
          RENAME remat-worker.conf COMPONENT worker)
  install(FILES deploy/debian/remat-worker.default DESTINATION /etc/default RENAME remat-worker
          COMPONENT worker)
  # The Megatron Bridge callback, the recipe script and the example templates
  # (docs/megatron-bridge.md; the templates name these installed paths).
  install(FILES worker/megatron_bridge/remat_metrics_callback.py
          worker/megatron_bridge/pretrain_with_remat.py
          worker/megatron_bridge/command-templates.yaml
          DESTINATION ${CMAKE_INSTALL_DATADIR}/remat/megatron_bridge COMPONENT worker)
  # The megatron backend's driver (remat-worker --megatron-path finds it here by default).
  install(DIRECTORY worker/megatron_driver DESTINATION ${CMAKE_INSTALL_DATADIR}/remat
          COMPONENT worker PATTERN __pycache__ EXCLUDE)
  install(FILES worker/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR}/../remat-worker
          COMPONENT worker)
endif()
if(TARGET remat-trial)
  install(TARGETS remat-trial RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT engine)
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME remat)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "remat maintainers <remat@localhost>")
# No CPACK_PACKAGE_DESCRIPTION_SUMMARY: CPack would put that one line first in every package's
# description; each package's own first line (below) is its synopsis instead.
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_STRIP_FILES ON)  # RelWithDebInfo builds carry debug info the packages do not need
set(CPACK_DEBIAN_CLI_PACKAGE_NAME remat)
set(CPACK_DEBIAN_REMATD_PACKAGE_NAME rematd)
set(CPACK_DEBIAN_WORKER_PACKAGE_NAME remat-worker)
set(CPACK_DEBIAN_ENGINE_PACKAGE_NAME remat-engine)
set(CPACK_DEBIAN_WORKER_PACKAGE_RECOMMENDS remat-engine)
# /etc/default files are conffiles (kept on upgrade).
file(WRITE ${CMAKE_BINARY_DIR}/debian/rematd/conffiles "/etc/default/rematd\n")
file(WRITE ${CMAKE_BINARY_DIR}/debian/worker/conffiles "/etc/default/remat-worker\n")
# Maintainer scripts of the two services, with the unit's name filled in: daemon-reload,
# restart on upgrade (postinst), stop on removal (prerm), forget the unit (postrm).
set(REMAT_REMATD_UNIT rematd.service)
set(REMAT_WORKER_UNIT remat-worker.service)
foreach(comp rematd worker)
  string(TOUPPER ${comp} COMP)
  set(UNIT ${REMAT_${COMP}_UNIT})
  set(extra)
  foreach(script postinst prerm postrm)
    configure_file(deploy/debian/${script} ${CMAKE_BINARY_DIR}/debian/${comp}/${script} @ONLY)
    list(APPEND extra ${CMAKE_BINARY_DIR}/debian/${comp}/${script})
  endforeach()
  list(APPEND extra ${CMAKE_BINARY_DIR}/debian/${comp}/conffiles)
  set(CPACK_DEBIAN_${COMP}_PACKAGE_CONTROL_EXTRA "${extra}")
  set(CPACK_DEBIAN_${COMP}_PACKAGE_CONTROL_STRICT_PERMISSION ON)
endforeach()
# Every package carries the copyright file where Debian looks for it.
foreach(pair "remat;cli;remat" "rematd;rematd;rematd" "remat-worker;worker;remat-worker"
             "remat-trial;engine;remat-engine")
  list(GET pair 0 target)
  list(GET pair 1 comp)
  list(GET pair 2 pkg)
  if(TARGET ${target})
    install(FILES deploy/debian/copyright DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${pkg}
            COMPONENT ${comp})
  endif()
endforeach()
# One description per package: a synopsis line, then what it holds and where it goes.
set(CPACK_DEBIAN_CLI_DESCRIPTION "remat command line: plan, validate and run recompute searches
The remat CLI finds the best activation-recompute policy for a Megatron Core or Megatron Bridge
training job by measuring it: remat plan, validate, import and a whole local search, and the
client of a remat coordinator (submit, get, watch, cancel, list). Also the Slurm prolog that
submits the search a job asks for (/usr/libexec/remat).")
set(CPACK_DEBIAN_REMATD_DESCRIPTION "remat coordinator daemon (rematd)
rematd serves the remat gRPC API to users and workers: it plans each search, hands its trials
to remat-worker daemons, keeps searches and results in SQLite, and exports Prometheus metrics.
Installs the hardened systemd unit rematd.service, the system user remat and
/etc/default/rematd.")
set(CPACK_DEBIAN_WORKER_DESCRIPTION "remat worker daemon for GPU nodes (remat-worker)
remat-worker registers a node's GPUs with a remat coordinator, leases trials, runs each one
(remat-trial, Megatron or an operator's command template; on the node or as Slurm jobs) and
reports the measured memory and throughput. Installs the hardened systemd unit
remat-worker.service, the Megatron Bridge callback and the megatron backend's driver.")
set(CPACK_DEBIAN_ENGINE_DESCRIPTION "remat trial engine (remat-trial, LibTorch)
remat-trial runs one rank of one recompute trial with LibTorch (CUDA and NCCL where present,
the CPU otherwise) and writes what it measured. Packaged apart from remat-worker because it is
the heavy one: GPU nodes build it against their CUDA LibTorch.")
set(CPACK_COMPONENTS_ALL cli rematd worker)
if(TARGET remat-trial)
  list(APPEND CPACK_COMPONENTS_ALL engine)
endif()
include(CPack)
