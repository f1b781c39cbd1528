"""Plain torch, no holdfast, on a DCP checkpoint that a holdfast job wrote.

    dcp_plain_load.py CKPT            loads the DDP example's model from it
                                      and prints the example's hash line:
                                      `plain step=<S> params_sha256=<hex>`
    dcp_plain_load.py CKPT --resave OUT
                                      reads every tensor in it and writes
                                      them to OUT as a checkpoint of its own
"""

import pathlib
import sys

import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]
                       / "examples" / "python"))
from mlp_data import make_model, state_sha256  # noqa: E402

if len(sys.argv) == 4 and sys.argv[2] == "--resave":
    meta = dcp.FileSystemReader(sys.argv[1]).read_metadata()
    state = {key: torch.empty(tuple(entry.size), dtype=entry.properties.dtype)
             for key, entry in meta.state_dict_metadata.items()}
    dcp.load(state, checkpoint_id=sys.argv[1], no_dist=True)
    dcp.save(state, checkpoint_id=sys.argv[3], no_dist=True)
    print(f"resaved {len(state)} tensors")
    sys.exit(0)

# The DDP example's state as it registers it: its model, SGD's momentum
# and its data position.
model = make_model()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for p in model.parameters():
    opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
data_pos = torch.zeros(1, dtype=torch.int64)
state = {f"model.{k}": v for k, v in model.state_dict().items()}
for index, p in enumerate(model.parameters()):
    state[f"sgd.{index}.momentum_buffer"] = opt.state[p]["momentum_buffer"]
state["data_pos"] = data_pos
state["holdfast.step"] = torch.zeros(1, dtype=torch.int64)
dcp.load(state, checkpoint_id=sys.argv[1], no_dist=True)
print(f"plain step={int(state['holdfast.step'][0])} "
      f"params_sha256={state_sha256(model, opt, data_pos)}")
