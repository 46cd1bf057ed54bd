# Helpers sourced by every corpus case (run-corpus.sh). Everything writes under /tmp/hostile-work.
W=/tmp/hostile-work; H=${H:-/tmp/hostile}
export PATH=$H/.venv/bin:$PATH
SRV=http://127.0.0.1:18765; API=https://127.0.0.1:18766
# a fresh copy of the project's profiles under $W/p/NAME
mkprof() { local d=$W/p/$1; rm -rf "$d"; mkdir -p "$d"; cp $H/profiles/*.yaml "$d"/; echo "$d"; }
# a fresh (absent) output path under $W/o/NAME
fresh() { local d=$W/o/$1; rm -rf "$d" "$W"/o/."$1".*; mkdir -p $W/o; echo "$d"; }
# inference-run (the machine's runtime) on the render OUT, in dry-run mode, with a clean environment
dryrun() { env -i PATH=/usr/bin:/bin HOME=$W TMPDIR=$W/tmp INFERENCE_ROOT=$1 INFERENCE_DRY_RUN=1 "$H/.venv/bin/inference-run" "$2"; }
# every rendered file of OUT, for greps
files() { find "$1" -type f; }
# a scratch machine root for the runtime scripts, with stubs first on PATH
rt() { local d=$W/rt/$1; rm -rf "$d"; mkdir -p "$d/etc/inference-image"; echo "$d"; }
stubenv() { echo "PATH=$W/fx/stubs:$H/.venv/bin:/usr/bin:/bin STUB_LOG=$1"; }
# a fleet file of the given YAML body
fleet() { local f=$W/fx/fleet-$1.yaml; printf '%s\n' "$2" > "$f"; echo "$f"; }
