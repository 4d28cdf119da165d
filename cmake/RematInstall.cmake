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
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "finds the best activation-recompute policy for a Megatron job by measuring it")
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
# The system user and /etc/remat; /etc/default files are conffiles (kept on upgrade).
file(WRITE ${CMAKE_BINARY_DIR}/debian/rematd/conffiles "/etc/default/rematd\n")
file(WRITE ${CMAKE_BINARY_DIR}/debian/worker/conffiles "/etc/default/remat-worker\n")
foreach(comp rematd worker)
  configure_file(deploy/debian/postinst ${CMAKE_BINARY_DIR}/debian/${comp}/postinst COPYONLY)
  string(TOUPPER ${comp} COMP)
  set(CPACK_DEBIAN_${COMP}_PACKAGE_CONTROL_EXTRA
      "${CMAKE_BINARY_DIR}/debian/${comp}/postinst;${CMAKE_BINARY_DIR}/debian/${comp}/conffiles")
  set(CPACK_DEBIAN_${COMP}_PACKAGE_CONTROL_STRICT_PERMISSION ON)
endforeach()
set(CPACK_COMPONENTS_ALL cli rematd worker)
if(TARGET remat-trial)
  list(APPEND CPACK_COMPONENTS_ALL engine)
endif()
include(CPack)
