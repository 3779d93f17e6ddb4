import pytest
import torch

from gradnode.node.config import DataConfig
from gradnode.node.train.data import Batches, load_corpus, split_documents, stdlib_root


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(DataConfig())


def test_stdlib_corpus_is_found_and_split(corpus):
    assert stdlib_root().is_dir()
    assert corpus.documents > 500
    assert corpus.train.dtype == torch.uint8
    assert 0.005 < corpus.val.numel() / corpus.nbytes < 0.05


def test_split_is_deterministic_and_disjoint():
    docs = [(f"doc{i}.py", f"body of document {i}; ".encode() * 3) for i in range(400)]
    train, val = split_documents(docs, 0.1)
    train2, val2 = split_documents(list(reversed(docs)), 0.1)
    assert val and train
    # Same documents on each side whatever the discovery order.
    assert sorted(val.split(b"\n\n")) == sorted(val2.split(b"\n\n"))
    val_docs = set(val.split(b"\n\n"))
    assert not val_docs & set(train.split(b"\n\n"))
    assert len(val_docs) + len(set(train.split(b"\n\n"))) == len(docs)


def test_single_document_is_split_by_its_tail():
    train, val = split_documents([("only", bytes(range(200)) * 10)], 0.1)
    assert len(val) == 200 and train + val == bytes(range(200)) * 10


def test_batches_reproducible_and_distinct_per_peer_and_step(corpus):
    b = Batches(corpus, seq_len=16, batch_size=4, run_id="r", seed=0)
    x1, y1 = b.train(peer=0, step=3)
    x2, _ = Batches(corpus, 16, 4, "r", 0).train(peer=0, step=3)
    assert torch.equal(x1, x2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(x1, b.train(peer=1, step=3)[0])
    assert not torch.equal(x1, b.train(peer=0, step=4)[0])
    assert not torch.equal(x1, b.train(peer=0, step=3, micro=1)[0])
    assert not torch.equal(x1, Batches(corpus, 16, 4, "other-run", 0).train(peer=0, step=3)[0])
    assert torch.equal(b.val(0)[0], Batches(corpus, 16, 4, "r", 0).val(0)[0])


def test_text_files_and_folders(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 200)
    sub = tmp_path / "dir"
    sub.mkdir()
    for i in range(30):
        (sub / f"f{i}.md").write_text(f"file {i} " * 50)
    (sub / "skip.bin").write_bytes(b"\0" * 100)
    corpus = load_corpus(DataConfig(source="text", paths=[tmp_path / "a.txt", sub]))
    assert corpus.documents == 31
    assert b"\0" * 100 not in bytes(corpus.train.tolist())


def test_missing_path_names_the_key(tmp_path):
    with pytest.raises(ValueError, match="data.paths.*does not exist"):
        load_corpus(DataConfig(source="text", paths=[tmp_path / "missing"]))


def test_empty_corpus_names_the_key(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="data.paths.*empty"):
        load_corpus(DataConfig(source="text", paths=[tmp_path]))


def test_sequence_longer_than_split(tmp_path):
    (tmp_path / "small.txt").write_text("x" * 2000)
    corpus = load_corpus(DataConfig(source="text", paths=[tmp_path / "small.txt"]))
    with pytest.raises(ValueError, match="model.seq_len"):
        Batches(corpus, seq_len=512, batch_size=2, run_id="r", seed=0)
