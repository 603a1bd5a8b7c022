#!/usr/bin/env bash
# Debian's `prometheus` binary for tests/engine/test_dashboard.py (it runs the binary as a child
# process scraping `vllm serve`; the package's own service is never used).  Installs it when this
# user can (root, apt-get); otherwise says so in one line and exits 0: that test then skips.
set -uo pipefail
command -v prometheus >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install_prometheus: no 'prometheus' on PATH and no root apt-get to install it; tests/engine/test_dashboard.py will skip"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt_install() { apt-get install -y -qq --no-install-recommends prometheus; }
{ apt_install || { apt-get update -qq && apt_install; }; } >/dev/null 2>&1
if command -v prometheus >/dev/null 2>&1; then
  echo "install_prometheus: installed Debian's prometheus ($(dpkg-query -W -f='${Version}' prometheus 2>/dev/null)) for the dashboard test"
else
  echo "install_prometheus: apt-get could not install Debian's 'prometheus'; tests/engine/test_dashboard.py will skip"
fi
exit 0
