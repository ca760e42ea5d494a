# Source me: retry_once CMD [ARGS...] runs CMD, and once more after a pause when it fails (a transient
# package download error). Its status is that of the last try. TPU_CLOSURE_FIX_RETRY_PAUSE: seconds (10).
retry_once() {
  local status=0
  "$@" && return 0 || status=$?
  echo "== $* failed (exit $status); trying once more in ${TPU_CLOSURE_FIX_RETRY_PAUSE:-10} s" >&2
  sleep "${TPU_CLOSURE_FIX_RETRY_PAUSE:-10}"
  "$@"
}
