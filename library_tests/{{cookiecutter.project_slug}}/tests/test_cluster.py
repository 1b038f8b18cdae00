"""Multi-node training under SLURM: Lightning reads the job's layout, and the sbatch script
asks for what a requeue needs."""

import subprocess
from pathlib import Path

import pytest
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from test_train import parse

PROJECT = Path(__file__).resolve().parents[1]

SLURM_TASK = {
    "SLURM_JOB_NAME": "train",
    "SLURM_JOB_ID": "1234",
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_NNODES": "2",
    "SLURM_NODELIST": "node[1-2]",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
}


@pytest.fixture
def slurm_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend to be task 3 of 4 started by srun (2 nodes x 2 tasks)."""
    for key, value in SLURM_TASK.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/srun" if name == "srun" else None)
    # The Trainer records the global rank process-wide; restore it for the next tests.
    monkeypatch.setattr(rank_zero_only, "rank", rank_zero_only.rank)


@pytest.mark.usefixtures("slurm_task")
def test_slurm_environment_is_detected(data_args: list[str]) -> None:
    layout = ["--devices", "2", "--num_nodes", "2", "--strategy", "ddp"]
    cli = parse("--accelerator", "cpu", *layout, *data_args)
    environment = cli.trainer.strategy.cluster_environment
    assert isinstance(environment, SLURMEnvironment)
    assert (environment.world_size(), environment.global_rank()) == (4, 3)
    assert (environment.local_rank(), environment.node_rank()) == (1, 1)


@pytest.mark.usefixtures("slurm_task")
def test_slurm_tasks_per_node_must_match_devices(data_args: list[str]) -> None:
    cli = parse("--accelerator", "cpu", "--devices", "1", "--num_nodes", "2", *data_args)
    # Lightning checks the SLURM layout when fit launches the processes, before any work.
    with pytest.raises(ValueError, match=r"--ntasks-per-node=2.*does not match"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)


def test_sbatch_script_checkpoints_before_the_time_limit() -> None:
    script = PROJECT / "scripts" / "slurm" / "train.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "#SBATCH --signal=SIGUSR1@90" in text
    assert "srun python train.py" in text
    assert '--devices "$SLURM_NTASKS_PER_NODE"' in text and '--num_nodes "$SLURM_NNODES"' in text
