"""tools/install_system_deps.sh: only missing packages are installed, and while apt runs a
policy-rc.d forbids starting services (exit 101), then goes away; one already there stays.

dpkg, apt-get and id are stand-ins on PATH (a test must not install Debian packages); the
stand-in apt-get records, at the moment it runs, what the policy file holds and what running
it answers, which is what a postinst's invoke-rc.d would ask."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "install_system_deps.sh"

FAKES = {
    # Installed: whatever INSTALLED (space-separated) lists.
    "dpkg": '#!/bin/bash\n[ "$1" = -s ] && [[ " $INSTALLED " == *" $2 "* ]]\n',
    "id": "#!/bin/sh\necho 0\n",
    "apt-get": """#!/bin/bash
echo "apt-get $*" >> "$LOG"
if [ "$1" = install ]; then
  if [ -x "$POLICY_RC_D" ]; then "$POLICY_RC_D" nginx start; echo "policy answers $?" >> "$LOG"
  else echo "no policy" >> "$LOG"; fi
  exit "${APT_EXIT:-0}"
fi
""",
}


def _run(tmp_path: Path, *packages: str, installed: str = "", apt_exit: int = 0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in FAKES.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    log, policy = tmp_path / "apt.log", tmp_path / "policy-rc.d"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log),
           "POLICY_RC_D": str(policy), "INSTALLED": installed, "APT_EXIT": str(apt_exit)}
    run = subprocess.run(["bash", str(SCRIPT), *packages], env=env, capture_output=True,
                         text=True, timeout=30)
    return run, (log.read_text().splitlines() if log.exists() else []), policy


def test_missing_packages_install_with_services_forbidden_then_the_policy_goes(tmp_path):
    run, log, policy = _run(tmp_path, "prometheus", "nginx", "chromium", installed="chromium")
    assert run.returncode == 0, run.stderr
    assert log == ["apt-get update -qq",
                   "apt-get install -y -qq --no-install-recommends prometheus nginx",
                   "policy answers 101"]
    assert not policy.exists()


def test_a_policy_already_there_is_kept(tmp_path):
    policy = tmp_path / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 0\n")
    policy.chmod(0o755)
    run, log, _ = _run(tmp_path, "nginx")
    assert run.returncode == 0, run.stderr
    assert log[-1] == "policy answers 0"        # the site's own policy decided, not ours
    assert policy.read_text() == "#!/bin/sh\nexit 0\n"


def test_nothing_missing_runs_no_apt(tmp_path):
    run, log, policy = _run(tmp_path, "nginx", "prometheus", installed="nginx prometheus")
    assert run.returncode == 0 and log == [] and not policy.exists()


def test_a_failed_install_fails_and_still_removes_the_policy(tmp_path):
    run, log, policy = _run(tmp_path, "nginx", apt_exit=100)
    assert run.returncode == 100 and log[-1] == "policy answers 101"
    assert not policy.exists()
