"""The tally_grad_norm fixture (tally_adapters.pytest_plugin) in a test suite, run by pytest's own
runner (pytester) against the installed package: a run that counts right passes, a miscount fails
the test with tally's diagnosis, bad manifests and a missing tally fail naming why. The "framework"
is tally's own model of the path, whose manifests `tally run --manifests` writes. Collected by
pytest only (the file name is not unittest's test*.py): it needs pytest."""

import subprocess

FOUNDING = ["--tp", "2", "--ep", "2", "--etp", "1", "--num-layers", "1", "--hidden-size", "8",
            "--num-attention-heads", "4", "--num-experts", "2", "--moe-ffn-hidden-size", "16",
            "--ffn-hidden-size", "16", "--vocab-size", "16", "--optimizer", "layerwise"]


def manifests(tally, folder, *flags):
    """The manifests tally's model writes for the founding case (Megatron-LM #6099) at world 8."""
    subprocess.run([tally, "run", "--world", "8", *FOUNDING, *flags, "--manifests", str(folder)],
                   capture_output=True, check=False)
    return folder


def suite_copying(pytester, folder):
    """A test file whose "framework" writes the manifests in `folder`."""
    pytester.makepyfile(f"""
import shutil

def test_grad_norm(tally_grad_norm):
    report = tally_grad_norm.judge(lambda out_dir: shutil.copytree({str(folder)!r}, out_dir, dirs_exist_ok=True))
    assert "verdict: PASS" in report
""")


def test_a_run_that_counts_every_element_once_passes(pytester, tally, tmp_path):
    suite_copying(pytester, manifests(tally, tmp_path / "run"))
    pytester.runpytest(f"--tally={tally}").assert_outcomes(passed=1)


def test_a_miscount_fails_the_test_with_tallys_diagnosis(pytester, tally, tmp_path):
    suite_copying(pytester, manifests(tally, tmp_path / "run", "--fault", "expert-dedup-on-dense-tp"))
    result = pytester.runpytest(f"--tally={tally}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*linear_fc2.bias*counted 0 times*", "*verdict: FAIL*", "*the run's manifests: *",
                                 "*GradNormMiscount*"])


def test_manifests_tally_cannot_read_fail_the_test_saying_so(pytester, tally, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "rank-0.json").write_text("{}")
    suite_copying(pytester, folder)
    result = pytester.runpytest(f"--tally={tally}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*tally could not judge*(exit 2)*"])


def test_a_missing_tally_fails_naming_where_it_looked_or_skips_when_asked(pytester, tmp_path):
    suite_copying(pytester, tmp_path)
    missing = str(tmp_path / "no-tally-here")
    result = pytester.runpytest(f"--tally={missing}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*no tally binary at '{missing}'*"])
    pytester.runpytest(f"--tally={missing}", "--tally-skip-missing").assert_outcomes(skipped=1)
