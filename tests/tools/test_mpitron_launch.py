#!/usr/bin/env python3
"""tools/mpitron-launch's decisions against a fake mpirun / srun (no MPI, no build):
which cause, rank and host it names from mpirun's and srun's messages and from the
failure records, the hostfiles and --exclude of the next attempts, the back-off, that a
plain error of the job is not restarted, and --max-restarts. The real job under real
mpirun is tests/apps/test_launcher.cpp."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

LAUNCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "mpitron-launch")

# A fake launcher: attempt K does what SCRIPT[K] says (print, records, latest checkpoint, exit code).
FAKE = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, sys
    plan = json.load(open(os.environ["FAKE_PLAN"]))
    k = int(os.environ["MPITRON_LAUNCH_ATTEMPT"])
    step = plan[min(k, len(plan) - 1)]
    with open(os.environ["FAKE_ARGS"], "a") as f:
        f.write(json.dumps(sys.argv[1:]) + "\\n")
    save = sys.argv[sys.argv.index("--save") + 1]
    os.makedirs(save, exist_ok=True)
    open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w").write(str(step["latest"]) + "\\n")
    for i, r in enumerate(step.get("records", [])):
        json.dump(r, open(os.path.join(os.environ["MPITRON_FAILURE_DIR"], "rank-%d.json" % r["reporter"]), "w"))
    print(step.get("say", ""))
    sys.exit(step["rc"])
""")


def read(path):
    with open(path) as f:
        return f.read()


class LaunchTest(unittest.TestCase):
    def run_launch(self, plan, extra, hosts="n1 slots=2\nn2 slots=2\nn3 slots=2\n", env=None):
        d = tempfile.mkdtemp(prefix="mpitron_launch_")
        self.addCleanup(shutil.rmtree, d, True)
        fake = os.path.join(d, "fake")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, 0o755)
        with open(os.path.join(d, "plan.json"), "w") as f:
            json.dump(plan, f)
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write(hosts)
        e = dict(os.environ, FAKE_PLAN=os.path.join(d, "plan.json"), FAKE_ARGS=os.path.join(d, "args"))
        e.update(env or {})
        save = os.path.join(d, "ckpt")
        cmd = [sys.executable, LAUNCH, "--backoff", "0.01"] + extra(d, fake) + [
            "--", "app", "--save", save, "--train-iters", "100"]
        p = subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=d)
        args = []
        if os.path.exists(os.path.join(d, "args")):
            with open(os.path.join(d, "args")) as f:
                args = [json.loads(l) for l in f]
        return p, args, save

    def test_kill_then_freeze_then_done(self):
        plan = [
            {"rc": 137, "latest": 20, "say": "mpirun noticed that process rank 3 with PID 7 on node n2 exited on signal 9 (Killed)."},
            {"rc": 1, "latest": 50, "records": [
                {"cause": "comm_timeout", "rank": 1, "host": "n3", "phase": "step", "step": 61, "reporter": 0},
                {"cause": "comm_timeout", "rank": 2, "host": "n1", "phase": "step", "step": 61, "reporter": 3},
                {"cause": "comm_timeout", "rank": 1, "host": "n3", "phase": "step", "step": 61, "reporter": 2}]},
            {"rc": 0, "latest": 100}]
        p, args, save = self.run_launch(plan, lambda d, fake: ["--hostfile", "hosts", "--np", "4", "--mpirun", fake],
                                        hosts="n1 slots=2\nn2 slots=2\nn3 slots=2\nn4 slots=2\n")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("killed by signal 9 (Killed) of rank 3 on host n2", p.stdout)
        self.assertIn("frozen or hung (its peers' collectives timed out) of rank 1 on host n3 (phase step, step 61)", p.stdout)
        self.assertIn("attempt 2 finished (exit 0)", p.stdout)
        self.assertEqual(read(os.path.join(save, "launch", "attempt-1.hosts")), "n1 slots=2\nn3 slots=2\nn4 slots=2\n")
        self.assertEqual(read(os.path.join(save, "launch", "attempt-2.hosts")), "n1 slots=2\nn4 slots=2\n")
        # Later attempts resume from --save; the first runs the user's command unchanged.
        self.assertNotIn("--load", args[0])
        self.assertEqual(args[1][-2:], ["--load", save])
        self.assertIn("--map-by", args[0])
        self.assertIn("restart 2/3 in 0.02 s", p.stdout)

    def test_host_fault_exit_16(self):
        plan = [{"rc": 16, "latest": 30, "records": [
                    {"cause": "host_fault", "rank": 0, "host": "n1.cluster", "phase": "step", "step": 35, "reporter": 0}]},
                {"rc": 0, "latest": 100}]
        p, _, save = self.run_launch(plan, lambda d, fake: ["--hostfile", "hosts", "--np", "2", "--mpirun", fake])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("host fault", p.stdout)
        self.assertIn("of rank 0 on host n1 (phase step, step 35)", p.stdout)  # n1.cluster is n1 of the hostfile
        self.assertIn("excluding host n1", p.stdout)

    def test_phase_timeouts(self):
        plan = [{"rc": 1, "latest": 10, "records": [
                    {"cause": "phase_timeout", "rank": -1, "host": "", "phase": "step", "step": 12, "reporter": 0},
                    {"cause": "phase_timeout", "rank": 1, "host": "x", "phase": "step", "step": 12, "reporter": 1}]},
                {"rc": 1, "latest": 10, "records": [
                    {"cause": "phase_timeout", "rank": -1, "host": "", "phase": "checkpoint-save", "step": 20,
                     "reporter": 1}]},
                {"rc": 0, "latest": 100}]
        p, _, _ = self.run_launch(plan, lambda d, fake: ["--hostfile", "hosts", "--np", "2", "--mpirun", fake,
                                                         "--local-alias"],
                                  hosts="a slots=1\nb slots=1\nc slots=1\nd slots=1\n")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("the rank stuck itself of rank 1 on host b (phase step, step 12)", p.stdout)
        # Then rank 0 (on c, after b's exclusion) wrote nothing: it is the one.
        self.assertIn("waiting for a rank that wrote no record of rank 0 on host a (phase checkpoint-save, step 20)",
                      p.stdout)

    def test_plain_error_is_not_restarted(self):
        plan = [{"rc": 1, "latest": 0, "records": [
                    {"cause": "error", "rank": 0, "host": "n1", "phase": "setup", "step": 0, "reporter": 0,
                     "message": "--num-layers is required"}]}]
        p, args, _ = self.run_launch(plan, lambda d, fake: ["--hostfile", "hosts", "--np", "2", "--mpirun", fake])
        self.assertEqual(p.returncode, 1)
        self.assertEqual(len(args), 1)
        self.assertIn("an error of the job: --num-layers is required", p.stdout)
        self.assertIn("not restarting", p.stdout)

    def test_max_restarts_and_too_few_hosts(self):
        kill = {"rc": 137, "latest": 10, "say": "mpirun noticed that process rank 0 with PID 7 on node n1 exited on signal 9 (Killed)."}
        p, args, _ = self.run_launch([kill], lambda d, fake: ["--hostfile", "hosts", "--np", "2", "--mpirun", fake,
                                                              "--max-restarts", "1"])
        self.assertEqual(p.returncode, 137)
        self.assertEqual(len(args), 2)
        self.assertIn("giving up after 1 restarts", p.stdout)
        p, args, _ = self.run_launch([kill], lambda d, fake: ["--hostfile", "hosts", "--np", "6", "--mpirun", fake])
        self.assertNotEqual(p.returncode, 0)
        self.assertEqual(len(args), 1)
        self.assertIn("only 4 slots are left on n2,n3 after excluding n1; 6 ranks are needed", p.stderr)

    def test_slurm_srun_exclude(self):
        plan = [{"rc": 1, "latest": 20, "say": "srun: error: node5: task 3: Killed"}, {"rc": 0, "latest": 100}]
        p, args, _ = self.run_launch(plan, lambda d, fake: ["--launcher", "srun", "--srun", fake],
                                     env={"SLURM_NTASKS": "4"})
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("task 3: Killed of rank 3 on host node5", p.stdout)
        self.assertEqual(args[0][:2], ["-n", "4"])
        self.assertEqual(args[1][:4], ["-n", "4", "--exclude", "node5"])

    def test_refusals(self):
        d = tempfile.mkdtemp(prefix="mpitron_launch_")
        self.addCleanup(shutil.rmtree, d, True)
        p = subprocess.run([sys.executable, LAUNCH, "--np", "2", "--hostfile", "/nonexistent", "--", "app", "--save", "x"],
                           capture_output=True, text=True, cwd=d)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--hostfile /nonexistent", p.stderr)
        p = subprocess.run([sys.executable, LAUNCH, "--np", "2", "--", "app"], capture_output=True, text=True, cwd=d)
        self.assertIn("no --save DIR", p.stderr)


if __name__ == "__main__":
    unittest.main()
