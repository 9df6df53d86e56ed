"""Every sample iterator takes the same output options (``output``, ``device``,
``pin_memory``) and converts its batches with the same function: a local
``ReplayIterator``, a client's ``sample_iterator`` and a sharded client's."""

from __future__ import annotations

import numpy as np
import pytest

from rlreplay import ReplayIterator, Table
from rlreplay.distributed import ShardedClient
from rlreplay.errors import InvalidArgumentError
from rlreplay.net import Client, Server


@pytest.fixture(scope="module")
def iterators():
    """Factories of the three iterators over tables holding x = 0..19."""
    tables = [Table("t", signature={"x": "int64"}, max_size=100) for _ in range(2)]
    for i, table in enumerate(tables):
        table.insert({"x": np.arange(10 * i, 10 * i + 10)})
    servers = [Server([t]).start() for t in tables]
    client = Client(servers[0].address)
    sharded = ShardedClient([s.address for s in servers])
    yield {
        "local": lambda **kw: ReplayIterator(tables[0], 4, timeout=5.0, **kw),
        "client": lambda **kw: client.sample_iterator("t", 4, timeout=5.0, **kw),
        "sharded": lambda **kw: sharded.sample_iterator("t", 4, timeout=5.0, **kw),
    }
    client.close()
    sharded.close()
    for server in servers:
        server.stop()


@pytest.mark.parametrize("kind", ["local", "client", "sharded"])
def test_every_iterator_gives_torch_batches_and_refuses_bad_options_alike(iterators, kind):
    torch = pytest.importorskip("torch")
    it = iterators[kind](output="torch")
    batch = next(it)
    assert isinstance(batch.data["x"], torch.Tensor) and batch.data["x"].shape == (4,)
    assert isinstance(batch.info.keys, np.ndarray)
    it.close()
    with pytest.raises(InvalidArgumentError, match=r"output='tensorflow' is unknown"):
        iterators[kind](output="tensorflow")
    with pytest.raises(InvalidArgumentError, match=r"pin_memory=True needs output='torch'"):
        iterators[kind](pin_memory=True)
