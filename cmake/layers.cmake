# The layers of src/, from the bottom, and what each may use: the one copy
# of the rules. CMakeLists.txt builds each layer's include view from them
# (an include of a src/ directory it may not use is not found), and
# cmake/check_layers.cmake checks every include in src/ and
# include/holdfast/ against them, and docs/architecture.md's table too.
#
#   holdfast_rule(NAME [USES dirs...] [API layers...] [HEADERS files...]
#                 [NO_VIEW])
#   USES     the layers below whose src/ directories (and public headers)
#            it may include; its own always;
#   API      layers whose public headers only it may include;
#   HEADERS  its public headers, under include/holdfast/;
#   NO_VIEW  compiled against the whole tree (bindings at the top); the
#            check still holds it to its rule.
set(HOLDFAST_LAYERS)
macro(holdfast_rule name)
  cmake_parse_arguments(_rule "NO_VIEW" "" "USES;API;HEADERS" ${ARGN})
  list(APPEND HOLDFAST_LAYERS ${name})
  set(HOLDFAST_USES_${name} ${_rule_USES})
  set(HOLDFAST_API_${name} ${_rule_API})
  set(HOLDFAST_HEADERS_${name} ${_rule_HEADERS})
  set(HOLDFAST_NO_VIEW_${name} ${_rule_NO_VIEW})
endmacro()

holdfast_rule(common
  HEADERS clock.h status.h tls.h trace.h types.h version.h testing/fake_clock.h)
holdfast_rule(trace USES common)
holdfast_rule(store USES common HEADERS store.h)
holdfast_rule(fault USES common)
holdfast_rule(backend USES common store)
holdfast_rule(backend/gloo USES common store backend)
holdfast_rule(backend/nccl USES common store backend)
holdfast_rule(comm USES common trace store fault backend
  HEADERS options.h work.h communicator.h)
# The public holdfast::nccl API: NCCL backends wrapped as communicators.
holdfast_rule(nccl USES common trace store fault backend backend/nccl comm
  HEADERS nccl.h)
holdfast_rule(checkpoint USES common API comm
  HEADERS state.h testing/backup_stats.h)
# The control plane. The diagnosis is pure: evidence in, a verdict out.
holdfast_rule(diagnosis USES common trace store)
holdfast_rule(control/wire USES common)
holdfast_rule(control/member USES common control/wire API store)
holdfast_rule(control/agent USES common control/wire)
holdfast_rule(control/etcd USES common control/wire)
holdfast_rule(control/controller USES common trace store diagnosis control/wire)
holdfast_rule(runtime USES common trace store fault backend comm control/wire
  control/member checkpoint HEADERS runtime.h)
# Bindings: libtorch's ProcessGroup, and the Python module.
holdfast_rule(torch API comm runtime HEADERS torch.h NO_VIEW)
holdfast_rule(python USES common comm runtime API nccl NO_VIEW)
