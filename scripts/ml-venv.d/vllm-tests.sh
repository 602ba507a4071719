#!/usr/bin/env bash
# Puts vLLM 0.33.0's own tests (tests/ of its PyPI sdist; the wheel does not ship them)
# into "$VENV/vllm-0.33.0-src", once, for python/tests/integrations/
# test_vllm_upstream_scheduler.py (scripts/test-integrations.sh points PAGEDKV_VLLM_SRC
# there). Downloads the sdist (47 MB), checks its sha256, extracts only tests/ and drops
# the archive. Idempotent: a stamp in the directory marks it done. On any failure it says
# why and exits 0: the upstream tests then report skipped.
#   PAGEDKV_VLLM_SDIST: a local copy of the sdist to use instead of downloading it.
# Usage: bash scripts/ml-venv.d/vllm-tests.sh VENV
set -euo pipefail
venv=${1:?usage: vllm-tests.sh VENV}
dest="$venv/vllm-0.33.0-src"
sha256=f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112
[ -f "$dest/.pagedkv-sdist-$sha256" ] && exit 0
url=https://files.pythonhosted.org/packages/f7/25/aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz
if ! "$venv/bin/python" - "$url" "$sha256" "$dest" "${PAGEDKV_VLLM_SDIST:-}" <<'EOF'; then
import hashlib, os, shutil, sys, tarfile, tempfile, urllib.request

url, want, dest, local = sys.argv[1:5]
work = tempfile.mkdtemp(prefix=".vllm-sdist-", dir=os.path.dirname(dest))
try:
    archive = local or os.path.join(work, "vllm-0.33.0.tar.gz")
    if not local:
        with urllib.request.urlopen(url, timeout=60) as r, open(archive, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    h = hashlib.sha256()
    with open(archive, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != want:
        sys.exit(f"{archive}: sha256 {h.hexdigest()}, expected {want}")
    out = os.path.join(work, "src")
    prefix = "vllm-0.33.0/tests/"
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix) or not (m.isfile() or m.isdir()):
                continue
            rel = m.name[len("vllm-0.33.0/"):]
            if os.path.isabs(rel) or ".." in rel.split("/"):
                sys.exit(f"unsafe path in the sdist: {m.name}")
            m.name = rel
            members.append(m)
        if not any(m.name == "tests/v1/core/test_scheduler.py" for m in members):
            sys.exit("the sdist has no tests/v1/core/test_scheduler.py")
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse links, devices
            tar.extractall(out, members=members, filter="data")
        else:
            tar.extractall(out, members=members)
    open(os.path.join(out, f".pagedkv-sdist-{want}"), "w").close()
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(out, dest)
    print(f"vllm-tests.sh: vLLM 0.33.0's tests/ ({len(members)} entries) in {dest}")
except Exception as e:  # offline, a truncated download, no space: say why
    sys.exit(f"{type(e).__name__}: {e}")
finally:
    shutil.rmtree(work, ignore_errors=True)
EOF
  echo "vllm-tests.sh: vLLM 0.33.0's tests could not be obtained (above);" \
    "test_vllm_upstream_scheduler.py reports skipped" >&2
fi
exit 0
