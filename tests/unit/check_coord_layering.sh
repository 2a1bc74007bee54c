#!/usr/bin/env bash
# check_coord_layering.sh — the coordinator's modules keep the structure coord.h describes:
# coord.c owns the loop and is the only module that calls the others; the registry, the planner
# and the sequencer are passive state machines that never call each other (nor coord.c); the
# admin module only parses and formats. Proven by the calls each file makes: a function call
# with another module's prefix (reg_, seq_, coord_, or a planner function beyond the placement
# table's accessors) fails the check, naming the file, the line and the call.
set -u
SRC=${EPMOE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}/coordinator
fails=0

# calls FILE PATTERN: lines of FILE that call a function matching PATTERN (comments stripped)
calls() {
    sed -e 's://.*$::' -e 's:/\*.*\*/::g' "$SRC/$1" | grep -nE "\b($2)[a-z_]*\(" || true
}

forbid() { # FILE WHAT PATTERN
    local hits
    hits=$(calls "$1" "$3")
    if [ -n "$hits" ]; then
        echo "FAIL $1 calls $2:"
        echo "$hits" | sed 's/^/    /'
        fails=$((fails + 1))
    fi
}

# The planner's state machine (plan_epochs); the table accessors (plan_rank_experts, plan_owner,
# plan_is_member, plan_same) read data a caller passes in and may be used anywhere.
PLAN_SM='plan_(epochs_|phase|current|latest|base|problem|rejoin|drained|set_drained|last_epoch|replan|try|send|why|applied|block|reconfigure)'

for f in registry.c registry_recv.c registry_send.c; do
    forbid $f "the sequencer" 'seq_'
    forbid $f "the planner's state machine" "$PLAN_SM"
    forbid $f "the daemon" 'coord_'
    forbid $f "the admin module" 'adm_'
done
forbid sequencer.c "the registry" 'reg_'
forbid sequencer.c "the planner's state machine" "$PLAN_SM"
forbid sequencer.c "the daemon" 'coord_'
forbid planner.c "the registry" 'reg_'
forbid planner.c "the sequencer" 'seq_'
forbid planner.c "the daemon" 'coord_'
forbid planner.c "the admin module" 'adm_'
forbid admin.c "the registry" 'reg_'
forbid admin.c "the sequencer" 'seq_'
forbid admin.c "the planner's state machine" "$PLAN_SM"
forbid admin.c "the daemon" 'coord_'
for f in registry.c registry_recv.c registry_send.c sequencer.c planner.c admin.c outbox.c reload.c; do
    [ -z "$(calls "$f" 'zmq_send|zmq_msg_send|wire_send')" ] ||
        { echo "FAIL $f sends on a socket (only coord.c does)"; fails=$((fails + 1)); }
done
# only coord.c lets the sequencer start the next step
for f in registry.c registry_recv.c registry_send.c sequencer.c planner.c admin.c; do
    [ "$f" = sequencer.c ] && continue
    [ -z "$(calls "$f" 'seq_pump')" ] || { echo "FAIL $f calls seq_pump"; fails=$((fails + 1)); }
done
n=$(sed -e 's://.*$::' "$SRC/sequencer.c" | grep -cE '\bseq_pump\(')
[ "$n" -eq 1 ] || { echo "FAIL sequencer.c calls seq_pump itself ($((n - 1)) times)"; fails=$((fails + 1)); }
grep -q "seq_pump(" "$SRC/coord.c" || { echo "FAIL coord.c does not drive seq_pump"; fails=$((fails + 1)); }
grep -q "zmq_poll(" "$SRC/coord.c" || { echo "FAIL the poll loop is not in coord.c"; fails=$((fails + 1)); }

if [ $fails -ne 0 ]; then
    echo "$fails layering violation(s)"
    exit 1
fi
echo "ok   coordinator layering: coord.c owns the loop; registry, planner, sequencer are passive"
