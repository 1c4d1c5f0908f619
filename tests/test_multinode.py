"""Multi-node DDP on one machine: two "nodes" of one CPU process each (gloo, MASTER_ADDR
127.0.0.1, NODE_RANK 0/1, as a cluster launcher sets them) train exactly what one node with two
processes trains: the same global batch, the same results.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ports import free_port

ARGS = ["train", "--max-steps", "10", "--no-wandb", "d_model=32", "d_ff=64", "n_heads=4", "n_layers=1",
        "data.vocab_size=500", "data.valid_size=100", "data.test_size=100", "data.max_tokens=2000",
        "eval.max_len_offset=10", "train.progress_bar=false", "train.val_check_interval=5",
        "eval.decode_test=false", "--accelerator", "cpu", "train.strategy=ddp"]
SAME = ("ppl", "bleu", "steps", "target_tokens", "params", "world_size", "convergence")




def command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ablate", *ARGS, "--out", str(out), *extra]


@pytest.mark.slow  # three DDP runs (~80 s on 2 idle cores); `make test` keeps test_run's two-process run
def test_two_nodes_give_the_results_of_one_node_with_two_processes(tmp_path: Path):
    port = free_port()
    nodes = [subprocess.Popen(command(tmp_path / "two-nodes", "--devices", "1", "train.num_nodes=2"),
                              env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                   "NODE_RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in (0, 1)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]
    one = subprocess.run(command(tmp_path / "one-node", "--devices", "2"), capture_output=True, text=True,
                         timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two_nodes = json.loads((tmp_path / "two-nodes" / "results.json").read_text())
    one_node = json.loads((tmp_path / "one-node" / "results.json").read_text())
    assert two_nodes["world_size"] == 2
    assert {k: two_nodes[k] for k in SAME} == {k: one_node[k] for k in SAME}
