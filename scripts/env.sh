# Source this file (`. scripts/env.sh`) to build and run ferrotrain by hand: it fetches the
# CPU libtorch into the cache on first use and points tch at it.
_ferrotrain_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)"
LIBTORCH="$("$_ferrotrain_root/scripts/setup-libtorch.sh" | tail -n1)"
export LIBTORCH
# Under contention libgomp's spinning threads steal the cores other ranks need.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export PATH="$_ferrotrain_root/target/debug:$PATH"
unset _ferrotrain_root
