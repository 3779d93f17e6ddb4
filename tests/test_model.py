import pytest
import torch

from gradnode.node.config import ModelConfig
from gradnode.node.train.model import GPT, build_model, count_params, gpt_param_count


@pytest.mark.parametrize("kw", [
    {"n_layer": 2, "d_model": 32, "n_head": 2, "seq_len": 16},
    {"n_layer": 4, "d_model": 256, "n_head": 4, "seq_len": 128},
    {"n_layer": 1, "d_model": 64, "n_head": 4, "seq_len": 8, "d_ff": 100, "tie_embeddings": False},
])
def test_shapes_and_param_count(kw):
    cfg = ModelConfig(**kw)
    model = build_model(cfg, seed=0)
    x = torch.randint(0, 256, (3, cfg.seq_len))
    assert model(x).shape == (3, cfg.seq_len, 256)
    assert count_params(model) == gpt_param_count(cfg)


def test_tiny_cpu_default_is_a_few_million_params():
    assert 2_000_000 < gpt_param_count(ModelConfig()) < 5_000_000


def test_gpt_presets_span_one_million_to_one_billion():
    assert 0.5e6 < gpt_param_count(ModelConfig(n_layer=4, d_model=128)) < 2e6
    big = ModelConfig(n_layer=24, n_head=16, d_model=2048, seq_len=1024)
    assert 1.0e9 < gpt_param_count(big) < 1.5e9


def test_init_is_reproducible_by_seed():
    cfg = ModelConfig(n_layer=1, d_model=32, n_head=2, seq_len=16)
    a, b, c = build_model(cfg, 1), build_model(cfg, 1), build_model(cfg, 2)
    for (n, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), n
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_causal_future_tokens_do_not_change_the_past():
    model = GPT(ModelConfig(n_layer=2, d_model=32, n_head=2, seq_len=16)).eval()
    x = torch.randint(0, 256, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 256
    with torch.no_grad():
        assert torch.allclose(model(x)[0, :10], model(y)[0, :10], atol=1e-6)


def test_tied_embeddings_share_storage():
    model = GPT(ModelConfig(n_layer=1, d_model=32, n_head=2, seq_len=8))
    assert model.head.weight is model.tok.weight
    assert "head.weight" not in dict(model.named_parameters())


def test_byte_vocab_needed():
    with pytest.raises(ValueError, match="model.vocab_size"):
        build_model(ModelConfig(vocab_size=100), seed=0)


def test_hf_model_from_local_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg_dir = tmp_path / "llama"
    transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=2, vocab_size=300, max_position_embeddings=32).save_pretrained(cfg_dir)
    model = build_model(ModelConfig(kind="hf", hf_config=str(cfg_dir), seq_len=16), seed=0)
    assert model(torch.randint(0, 256, (2, 16))).shape == (2, 16, 300)


def test_hf_missing_config_names_the_key(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="model.hf_config"):
        build_model(ModelConfig(kind="hf", hf_config=str(tmp_path / "nope")), seed=0)
