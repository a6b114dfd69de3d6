"""Writes the torch.save files of tests/unit/weights/torch_file_test.cpp with
real PyTorch (torch 2.11, the GPU nodes' version): python make.py DIR.

Values are fixed (arange-based), so the test knows them without Python:
  state.pt       a module's state_dict() (an OrderedDict with _metadata):
                 lin.weight = arange(12).view(3, 4) / 8 (float32),
                 lin.bias = [-1, 0, 1], bn.{weight = 1, bias = 0,
                 running_mean = 0, running_var = 1} (2,), bn.num_batches_tracked
                 = 7 (int64, 0-d), half = arange(4) / 4 (bfloat16),
                 view = lin.weight[1:, 1:].t() (shares lin.weight's storage:
                 an offset and strides), empty = zeros(0, 3)
  proto4.pt      the same dict saved with pickle protocol 4
  checkpoint.pt  {"epoch": 3, "state_dict": <state.pt's>, "optimizer": Adam's
                 state_dict() after one step, "best": 0.5, "tag": b"x",
                 "args": an argparse.Namespace, "big": 2**70, "neg": -5}
  module.pt      state.pt's names with DataParallel's "module." prefix
  whole.pt       torch.save(model): a pickled module, not a state dict
  legacy.pt      state.pt in the legacy format (_use_new_zipfile_serialization=False)
  script.pt      a TorchScript archive (torch.jit.save)
  nodict.pt      {"epoch": 1, "weights": [1, 2]}
  quant.pt       {"w": a quantized tensor}
  badentry.pt    {"state_dict": {"w": ones(2), "x": None}, "model": {"w": ones(2)}}
  neg.pt         {"w": complex([1+2j, 3-4j]).conj().imag (a view with the neg
                 bit: torch.load gives [-2, 4]), "m._extra_state": "text"}
"""
import argparse
import collections
import copy
import sys
from pathlib import Path

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(2)


def state():
    net = Net()
    with torch.no_grad():
        net.lin.weight.copy_(torch.arange(12.0).view(3, 4) / 8)
        net.lin.bias.copy_(torch.tensor([-1.0, 0.0, 1.0]))
        net.bn.num_batches_tracked.fill_(7)
    sd = net.state_dict()
    sd["half"] = (torch.arange(4.0) / 4).to(torch.bfloat16)
    sd["view"] = sd["lin.weight"][1:, 1:].t()
    sd["empty"] = torch.zeros(0, 3)
    return net, sd


def main(out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    net, sd = state()
    torch.save(sd, out / "state.pt")
    torch.save(sd, out / "proto4.pt", pickle_protocol=4)
    torch.save(collections.OrderedDict(("module." + k, v) for k, v in sd.items()), out / "module.pt")
    saved = copy.deepcopy(sd)  # the optimizer's step changes sd's tensors
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    net.lin(torch.ones(2, 4)).sum().backward()
    opt.step()
    ckpt = {"epoch": 3, "state_dict": saved, "optimizer": opt.state_dict(), "best": 0.5,
            "tag": b"x", "args": argparse.Namespace(lr=0.01, name="x"), "big": 2**70, "neg": -5}
    torch.save(ckpt, out / "checkpoint.pt")
    torch.save(torch.nn.Linear(2, 2), out / "whole.pt")
    torch.save(sd, out / "legacy.pt", _use_new_zipfile_serialization=False)
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), out / "script.pt")
    torch.save({"epoch": 1, "weights": [1, 2]}, out / "nodict.pt")
    q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)
    torch.save({"w": q}, out / "quant.pt")
    torch.save({"state_dict": {"w": torch.ones(2), "x": None}, "model": {"w": torch.ones(2)}},
               out / "badentry.pt")
    neg = torch.tensor([1 + 2j, 3 - 4j]).conj().imag
    assert neg.is_neg() and neg.tolist() == [-2.0, 4.0]
    torch.save({"w": neg, "m._extra_state": "text"}, out / "neg.pt")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
