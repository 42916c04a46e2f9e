"""Run Gymnasium's and SB3's own vector-env tests against shmvec (``make conformance``).

The upstream test files of the *installed* versions are fetched from the package registry
(``pip download --no-binary :all:``, the source distribution):

* SB3: ``tests/test_vec_envs.py``, with ``SubprocVecEnv`` swapped for
  :class:`shmvec.sb3.SubprocVecEnv`;
* Gymnasium: ``tests/vector/test_vector_env.py``, ``test_autoreset_mode.py`` and
  ``test_vector_env_info.py``, with ``AsyncVectorEnv`` swapped for :class:`shmvec.ShmVecEnv`
  (its keywords that ShmVecEnv does not take, such as ``shared_memory``, dropped).
  Gymnasium's source distribution holds no ``tests/vector``; then they come from
  ``--gymnasium-src`` (a source checkout, a git directory, or a ``.tar.gz`` of one), or else
  from the GitHub archive of the version's tag; if none is at hand the suite is reported as
  not run, with what to pass.

Each suite runs twice: against the upstream classes (a failure there is not shmvec's), then
against shmvec. The report lists the tests that fail only against shmvec. Exit status: 0 when
nothing fails only against shmvec and every suite ran, 1 otherwise.

Usage::

    python tests/conformance/run.py [--suite gymnasium|sb3|all] [--workdir build/conformance]
                                    [--gymnasium-src PATH] [--skip-upstream] [-- PYTEST_ARGS]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]  # the checkout whose shmvec is tested (put first on PYTHONPATH)
GYM_FILES = ["tests/vector/test_vector_env.py", "tests/vector/test_autoreset_mode.py",
             "tests/vector/test_vector_env_info.py"]
SB3_FILES = ["tests/test_vec_envs.py"]
GYM_ARCHIVE = "https://github.com/Farama-Foundation/Gymnasium/archive/refs/tags/v{version}.tar.gz"


class NotAvailable(Exception):
    """The upstream test files could not be obtained; the message says what to do."""


# -- getting the upstream files ---------------------------------------------------------------


def sdist(package: str, workdir: Path) -> Path:
    """The unpacked source distribution of the installed version of ``package``."""
    ver = version(package)
    dest = workdir / "sdist" / f"{package}-{ver}"
    if dest.is_dir():
        return dest
    download = workdir / "download"
    download.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
           f"{package}=={ver}", "-d", str(download)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise NotAvailable(f"`{' '.join(cmd)}` failed:\n{done.stderr.strip()}")
    stem = f"{package}_{ver}".replace("-", "_").lower()  # sdist names spell "-" and "_" either way
    archives = [p for p in download.iterdir()
                if p.name.endswith(".tar.gz") and p.name.replace("-", "_").lower() == stem + ".tar.gz"]
    if not archives:
        raise NotAvailable(f"pip downloaded no source archive of {package}=={ver} into {download}")
    return unpack(archives[0].read_bytes(), dest)


def unpack(data: bytes, dest: Path) -> Path:
    """Unpack a ``.tar.gz`` with one top folder into ``dest`` (that folder's contents)."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(tmp, filter="data")
    (top,) = tmp.iterdir()
    top.rename(dest)
    tmp.rmdir()
    return dest


def gymnasium_tests(workdir: Path, src: str | None) -> Path:
    """A folder holding Gymnasium's ``tests`` package for the installed version."""
    ver = version("gymnasium")
    root = sdist("gymnasium", workdir)
    if (root / "tests" / "vector").is_dir():
        return root
    tried = [f"the sdist gymnasium=={ver} (it has no tests/vector)"]
    if src:
        return gymnasium_from(Path(src), workdir / "sdist" / f"gymnasium-src-{ver}", ver)
    url = GYM_ARCHIVE.format(version=ver)
    try:
        with urllib.request.urlopen(url, timeout=60) as reply:
            return unpack(reply.read(), workdir / "sdist" / f"gymnasium-github-{ver}")
    except OSError as exc:
        tried.append(f"{url} ({exc})")
    raise NotAvailable(
        "Gymnasium's tests/vector could not be obtained; tried " + "; ".join(tried) + ".\n"
        f"Pass --gymnasium-src (or set GYMNASIUM_SRC, also for `make conformance`) to a Gymnasium {ver} "
        f"source checkout, its git directory, or a .tar.gz of it (e.g. `git clone --branch v{ver} "
        "https://github.com/Farama-Foundation/Gymnasium`)."
    )


def gymnasium_from(src: Path, dest: Path, ver: str) -> Path:
    """Gymnasium's tests out of ``src``: a checkout, a git directory or a ``.tar.gz``."""
    if dest.is_dir():
        shutil.rmtree(dest)
    if src.is_file():
        return unpack(src.read_bytes(), dest)
    if (src / "tests" / "vector").is_dir():
        dest.mkdir(parents=True)
        shutil.copytree(src / "tests", dest / "tests")
        return dest
    git = ["git", "--git-dir", str(src)]
    tag = f"v{ver}"
    rev = tag if subprocess.run([*git, "rev-parse", "--verify", "--quiet", tag], capture_output=True).returncode == 0 \
        else "HEAD"
    if rev == "HEAD":
        print(f"note: {src} has no tag {tag}; using the tests of its HEAD", file=sys.stderr)
    archive = subprocess.run([*git, "archive", "--format=tar.gz", f"--prefix=gymnasium-{ver}/", rev, "tests"],
                             capture_output=True)
    if archive.returncode:
        raise NotAvailable(f"--gymnasium-src {src}: not a checkout with tests/vector, a git directory or a "
                           f"tar.gz ({archive.stderr.decode().strip()})")
    return unpack(archive.stdout, dest)


# -- running them -----------------------------------------------------------------------------


@dataclass
class Outcome:
    """Test id -> "passed" / "failed" / "skipped" of one pytest run."""

    results: dict[str, str] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(1 for s in self.results.values() if s == status)

    def failed(self) -> set[str]:
        return {t for t, s in self.results.items() if s == "failed"}


def run_suite(suite: str, root: Path, files: list[str], target: str, workdir: Path, pytest_args: list[str]) -> Outcome:
    """Run ``files`` (relative to ``root``) with pytest against ``target`` and read the results."""
    shutil.copyfile(HERE / "upstream_conftest.py", root / "conftest.py")
    # An ini file of their own: the run's rootdir is the upstream tree, not this repository.
    (root / "pytest.ini").write_text("[pytest]\ntimeout = 300\n")
    report = workdir / f"{suite}-{target}.xml"
    env = dict(os.environ, SHMVEC_CONFORMANCE_TARGET=target, SHMVEC_CONFORMANCE_SUITE=suite)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *files,
           *pytest_args]
    print(f"\n=== {suite} against {target}: {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, cwd=root, env=env)
    return read_junit(report)


def read_junit(path: Path) -> Outcome:
    outcome = Outcome()
    if not path.exists():
        return outcome
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        status = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        if outcome.results.get(test) != "failed":  # a test failing in its teardown counts as failed
            outcome.results[test] = status
    return outcome


def summary(suite: str, shm: Outcome, upstream: Outcome | None) -> tuple[list[str], int]:
    """Report lines for one suite, and how many tests fail only against shmvec."""
    lines = [f"{suite}: {len(shm.results)} tests against shmvec: {shm.count('passed')} passed, "
             f"{shm.count('failed')} failed, {shm.count('skipped')} skipped"]
    failed = shm.failed()
    if upstream is not None:
        lines.append(f"{suite}: upstream classes: {upstream.count('passed')} passed, {upstream.count('failed')} failed, "
                     f"{upstream.count('skipped')} skipped")
        theirs = failed & upstream.failed()
        if theirs:
            lines.append(f"  failing against the upstream classes too (not shmvec's): {len(theirs)}")
            lines += [f"    {t}" for t in sorted(theirs)]
        failed -= theirs
    lines.append(f"  failing only against shmvec: {len(failed)}")
    lines += [f"    {t}" for t in sorted(failed)]
    return lines, len(failed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=["gymnasium", "sb3", "all"], default="all")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "conformance",
                        help="where the sources are unpacked and the reports written (default: %(default)s)")
    parser.add_argument("--gymnasium-src", default=os.environ.get("GYMNASIUM_SRC") or None, help="a Gymnasium source checkout, git directory or .tar.gz, used when "
                        "the registry's source distribution has no tests/vector (default: $GYMNASIUM_SRC)")
    parser.add_argument("--skip-upstream", action="store_true",
                        help="do not run the files against the upstream classes first")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    args = parser.parse_args(argv)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    suites = {
        "gymnasium": (lambda: gymnasium_tests(workdir, args.gymnasium_src), GYM_FILES),
        "sb3": (lambda: sdist("stable_baselines3", workdir), SB3_FILES),
    }
    report: list[str] = []
    ok = True
    for name, (fetch, files) in suites.items():
        if args.suite not in (name, "all"):
            continue
        try:
            root = fetch()
        except NotAvailable as exc:
            report.append(f"{name}: NOT RUN. {exc}")
            ok = False
            continue
        upstream = None if args.skip_upstream else run_suite(name, root, files, "upstream", workdir, args.pytest_args)
        shm = run_suite(name, root, files, "shmvec", workdir, args.pytest_args)
        if not shm.results:
            report.append(f"{name}: pytest reported no results (see its output above)")
            ok = False
            continue
        lines, ours = summary(name, shm, upstream)
        ok &= ours == 0
        report += lines
    print("\n=== conformance report\n" + "\n".join(report))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
