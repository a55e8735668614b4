"""Time-series and tabular model code: Amazon's Chronos-Bolt (a T5 encoder-decoder with patch
embeddings and quantile heads, from its config without weights) and Chronos-2 (its own
group-attention transformer with rotary embeddings), PyTorch Forecasting's Temporal Fusion
Transformer (variable selection networks, gated residual networks, LSTMs), N-BEATS and N-HiTS,
and pytorch-tabnet's TabNet (ghost batch norm, attentive transformers with xavier gains computed
from layer widths, a feature-group matrix, categorical embeddings) and its pretraining model."""

import torch
from chronos.chronos2.config import Chronos2CoreConfig
from chronos.chronos2.model import Chronos2Model
from chronos.chronos_bolt import ChronosBoltModelForForecasting
from harness import library_tests
from pytorch_forecasting.models import NBeats, NHiTS
from pytorch_forecasting.models.temporal_fusion_transformer import TemporalFusionTransformer
from pytorch_tabnet.tab_network import TabNet, TabNetPretraining
from pytorch_tabnet.utils import create_group_matrix
from transformers import T5Config

_QUANTILES = [0.1, 0.5, 0.9]


def _chronos_bolt():
    config = T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=1,
                      num_heads=4, chronos_config=dict(
                          context_length=64, prediction_length=8, input_patch_size=8,
                          input_patch_stride=8, quantiles=_QUANTILES, use_reg_token=True))
    return ChronosBoltModelForForecasting(config)


def _chronos2():
    config = Chronos2CoreConfig(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                chronos_config=dict(
                                    context_length=64, output_patch_size=8, input_patch_size=8,
                                    input_patch_stride=8, quantiles=_QUANTILES,
                                    use_reg_token=True, max_output_patches=2))
    return Chronos2Model(config)


def _tft():
    return TemporalFusionTransformer(
        hidden_size=8, lstm_layers=2, attention_head_size=2, hidden_continuous_size=4,
        output_size=3, x_reals=["a", "b"], x_categoricals=["c"], static_categoricals=["c"],
        static_reals=[], time_varying_categoricals_encoder=[],
        time_varying_categoricals_decoder=[], time_varying_reals_encoder=["a", "b"],
        time_varying_reals_decoder=["a"], embedding_sizes={"c": (5, 3)})


def _nbeats_nhits():
    return torch.nn.ModuleList([
        NBeats(context_length=16, prediction_length=4, widths=[16, 32], num_blocks=[1, 1],
               num_block_layers=[2, 2]),
        NHiTS(context_length=16, prediction_length=4, hidden_size=16, static_categoricals=[],
              x_reals=["target"], time_varying_reals_encoder=["target"],
              time_varying_reals_decoder=[])])


def _tabnet():
    groups = create_group_matrix([[1, 3], [4, 5]], 6)
    return torch.nn.ModuleList([
        TabNet(input_dim=6, output_dim=[2, 3], n_d=8, n_a=8, n_steps=3, cat_idxs=[0, 2],
               cat_dims=[4, 5], cat_emb_dim=[2, 3], virtual_batch_size=16, mask_type="entmax",
               group_attention_matrix=groups),
        TabNetPretraining(input_dim=6, pretraining_ratio=0.2, cat_idxs=[1], cat_dims=[3],
                          cat_emb_dim=[2], n_d=8, n_a=8, n_steps=2, n_shared_decoder=1,
                          n_indep_decoder=1, group_attention_matrix=groups)])


CASES = {
    "chronos-forecasting/chronos-bolt": _chronos_bolt,
    "chronos-forecasting/chronos-2": _chronos2,
    "pytorch-forecasting/temporal-fusion-transformer": _tft,
    "pytorch-forecasting/nbeats-nhits": _nbeats_nhits,
    "pytorch-tabnet/tabnet-and-pretraining": _tabnet,
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
