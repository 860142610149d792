# Sourced: ensure_docker_engine starts a Docker engine when none answers (installing Debian's
# docker.io as root when dockerd is missing). Returns 1 with the reason in DOCKER_ENGINE_ERROR
# where none can be started. dockerd keeps running afterwards (log /tmp/ferrotrain-dockerd.log).
DOCKER_ENGINE_ERROR=
docker_engine_up() { docker info >/dev/null 2>&1; }
ensure_docker_engine() {
  docker_engine_up && return 0
  if ! command -v dockerd >/dev/null; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      echo "installing docker.io (Debian's Docker engine)" >&2
      if ! { timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 \
          apt-get install -y -qq docker.io; } >/tmp/ferrotrain-apt-docker.log 2>&1; then
        tail -n 20 /tmp/ferrotrain-apt-docker.log >&2
        DOCKER_ENGINE_ERROR="apt-get install docker.io failed"
        return 1
      fi
    else
      DOCKER_ENGINE_ERROR="no Docker engine answers and dockerd is not installed (not root, or no apt-get)"
      return 1
    fi
  fi
  if ! command -v docker >/dev/null; then DOCKER_ENGINE_ERROR="no docker client"; return 1; fi
  if [[ $(id -u) != 0 ]]; then
    DOCKER_ENGINE_ERROR="no Docker engine answers and only root can start dockerd here"
    return 1
  fi
  echo "starting dockerd (log: /tmp/ferrotrain-dockerd.log; it keeps running afterwards)" >&2
  # setsid: dockerd outlives the caller and is not in its process group.
  setsid dockerd >/tmp/ferrotrain-dockerd.log 2>&1 < /dev/null &
  local i
  for i in $(seq 60); do docker_engine_up && return 0; sleep 1; done
  tail -n 20 /tmp/ferrotrain-dockerd.log >&2
  DOCKER_ENGINE_ERROR="dockerd did not answer within 60 s (see /tmp/ferrotrain-dockerd.log)"
  return 1
}
