#!/usr/bin/env bash
# Prepare a fresh Debian 12 machine (as root) to run kvtier's lab and tests:
# host packages, podman settings, the Python venv with pinned dependencies, and the base images.
# Every step checks before it acts, so a second run takes seconds.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${KVTIER_VENV:-$repo/.venv}
python=${PYTHON:-python3}

apt_packages=(
  podman runc uidmap slirp4netns fuse-overlayfs   # container test hosts
  mmdebstrap                                      # offline base images
  qemu-system-x86 qemu-utils                      # VM test hosts (storage node)
  openssh-client                                  # Ansible transport to VMs
  python3-venv
  redis-server                                    # unit tests start their own instance on a free port
  haproxy                                         # unit tests run the router role's configuration
  shellcheck                                      # make lint checks the shell scripts
  nftables                                        # unit tests check the firewall role's rendered table (nft -c)
  openssl                                         # the lab router's certificate (a real cluster brings its own)
  prometheus                                      # promtool: unit tests check the health textfile's metrics
)

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  say "installing host packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The tests run their own redis-server, haproxy and promtool; the packaged system services are not wanted here.
  for service in redis-server haproxy prometheus; do
    if [[ " ${missing[*]} " == *" $service "* ]] && command -v systemctl >/dev/null; then
      systemctl disable --now "$service.service" >/dev/null 2>&1 || true
    fi
  done
fi

# podman on this kind of host: crun rejects the hybrid cgroup layout and the default ulimits cannot be set
# (no CAP_SYS_RESOURCE). A drop-in keeps the distro's containers.conf untouched.
podman_conf=/etc/containers/containers.conf.d/50-kvtier.conf
if [ ! -f "$podman_conf" ]; then
  say "configuring podman ($podman_conf)"
  install -d /etc/containers/containers.conf.d
  cat >"$podman_conf" <<'CONF'
# Written by kvtier scripts/bootstrap.sh
[containers]
default_ulimits = []

[engine]
runtime = "runc"
CONF
fi

# The venv is rebuilt only when the lock file changes.
stamp="$venv/.kvtier-lock-sha"
want=$(sha256sum "$repo/requirements.lock" "$repo/pyproject.toml" | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "creating the Python venv in $venv"
  "$python" -m venv "$venv"
  # Every file is checked against the lock's sha256 (pip and setuptools included); kvtier itself is built
  # with the locked setuptools, not one fetched for an isolated build.
  "$venv/bin/pip" install --quiet --require-hashes -r "$repo/requirements.lock"
  "$venv/bin/pip" install --quiet --no-deps --no-build-isolation -e "$repo"
  echo "$want" >"$stamp"
fi

say "base images"
"$venv/bin/kvtier" images build
