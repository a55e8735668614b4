// A Llama-style decoder written with torch::nn, shaped like Meta's Llama 3 family. The demo,
// the benchmarks and the tests build it; it is ordinary model code with no knowledge of
// torchdefer, which is the point.
#pragma once

#include <torch/nn.h>

#include <cmath>
#include <string>

namespace torchdefer::models {

struct LlamaConfig {
  std::string name = "llama3-70b";
  int64_t dim = 8192;
  int64_t n_layers = 80;
  int64_t n_heads = 64;
  int64_t n_kv_heads = 8;
  int64_t ffn_dim = 28672;
  int64_t vocab_size = 128256;
  int64_t max_seq_len = 8192;
  double rope_theta = 500000.0;
  double norm_eps = 1e-5;

  int64_t head_dim() const { return dim / n_heads; }

  // Parameters of the model this config builds, counted from the shapes alone.
  int64_t parameter_count() const {
    const int64_t attention = dim * head_dim() * (2 * n_heads + 2 * n_kv_heads);
    const int64_t feed_forward = 3 * dim * ffn_dim;
    const int64_t per_layer = attention + feed_forward + 2 * dim;
    return n_layers * per_layer + 2 * vocab_size * dim + dim;
  }

  // Looks up a named size: llama3-405b, llama3-70b, llama3-8b, llama3.2-1b, llama-125m,
  // llama-30m, tiny.
  static LlamaConfig named(const std::string& name);
};

inline LlamaConfig LlamaConfig::named(const std::string& name) {
  LlamaConfig c;
  c.name = name;
  if (name == "llama3-405b") {
    c.dim = 16384, c.n_layers = 126, c.n_heads = 128, c.n_kv_heads = 8, c.ffn_dim = 53248;
  } else if (name == "llama3-70b") {
    // The defaults.
  } else if (name == "llama3-8b") {
    c.dim = 4096, c.n_layers = 32, c.n_heads = 32, c.n_kv_heads = 8, c.ffn_dim = 14336;
  } else if (name == "llama3.2-1b") {
    c.dim = 2048, c.n_layers = 16, c.n_heads = 32, c.n_kv_heads = 8, c.ffn_dim = 8192;
  } else if (name == "llama-30m") {
    c.dim = 384, c.n_layers = 6, c.n_heads = 6, c.n_kv_heads = 2, c.ffn_dim = 1024;
    c.vocab_size = 32000, c.max_seq_len = 1024;
  } else if (name == "llama-125m") {
    c.dim = 768, c.n_layers = 12, c.n_heads = 12, c.n_kv_heads = 12, c.ffn_dim = 2048;
    c.vocab_size = 32000, c.max_seq_len = 2048;
  } else if (name == "tiny") {
    c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.ffn_dim = 128;
    c.vocab_size = 256, c.max_seq_len = 32;
  } else {
    throw std::invalid_argument("unknown Llama size '" + name +
                                "'; known: llama3-405b, llama3-70b, llama3-8b, llama3.2-1b, "
                                "llama-125m, llama-30m, tiny");
  }
  return c;
}

// torch.nn.init.trunc_normal_ as PyTorch's Python implements it (inverse-CDF sampling), which
// the C++ frontend lacks.
inline void trunc_normal_(torch::Tensor& t, double std, double a, double b) {
  torch::NoGradGuard no_grad;
  auto cdf = [](double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; };
  t.uniform_(2 * cdf(a / std) - 1, 2 * cdf(b / std) - 1);
  t.erfinv_();
  t.mul_(std * std::sqrt(2.0));
  t.clamp_(a, b);
}

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
    weight = register_parameter("weight", torch::ones({dim}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps_) * weight;
  }
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaConfig& c)
      : n_heads_(c.n_heads), n_kv_heads_(c.n_kv_heads), head_dim_(c.head_dim()) {
    auto linear = [](int64_t in, int64_t out) {
      return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
    };
    wq = register_module("wq", linear(c.dim, c.n_heads * head_dim_));
    wk = register_module("wk", linear(c.dim, c.n_kv_heads * head_dim_));
    wv = register_module("wv", linear(c.dim, c.n_kv_heads * head_dim_));
    wo = register_module("wo", linear(c.n_heads * head_dim_, c.dim));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
    const int64_t batch = x.size(0), seq = x.size(1);
    auto heads = [&](const torch::Tensor& t, int64_t n) {
      return t.view({batch, seq, n, head_dim_}).transpose(1, 2);
    };
    torch::Tensor q = rotate(heads(wq(x), n_heads_), cos, sin);
    torch::Tensor k = rotate(heads(wk(x), n_kv_heads_), cos, sin);
    torch::Tensor v = heads(wv(x), n_kv_heads_);
    const int64_t groups = n_heads_ / n_kv_heads_;
    k = k.repeat_interleave(groups, 1);
    v = v.repeat_interleave(groups, 1);
    torch::Tensor scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(double(head_dim_));
    scores = scores + torch::full({seq, seq}, -INFINITY, scores.options()).triu(1);
    torch::Tensor out = torch::softmax(scores, -1).matmul(v);
    return wo(out.transpose(1, 2).reshape({batch, seq, n_heads_ * head_dim_}));
  }

  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};

 private:
  // Rotary position embedding on pairs (x[2i], x[2i+1]).
  static torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos,
                              const torch::Tensor& sin) {
    const int64_t seq = x.size(2);
    auto pairs = x.unflatten(-1, {-1, 2});
    auto even = pairs.select(-1, 0), odd = pairs.select(-1, 1);
    auto c = cos.narrow(0, 0, seq), s = sin.narrow(0, 0, seq);
    return torch::stack({even * c - odd * s, even * s + odd * c}, -1).flatten(-2);
  }

  int64_t n_heads_, n_kv_heads_, head_dim_;
};
TORCH_MODULE(Attention);

class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t dim, int64_t hidden) {
    auto linear = [](int64_t in, int64_t out) {
      return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
    };
    w1 = register_module("w1", linear(dim, hidden));
    w2 = register_module("w2", linear(hidden, dim));
    w3 = register_module("w3", linear(dim, hidden));
  }
  torch::Tensor forward(const torch::Tensor& x) { return w2(torch::silu(w1(x)) * w3(x)); }
  torch::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(FeedForward);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const LlamaConfig& c) {
    attention_norm = register_module("attention_norm", RMSNorm(c.dim, c.norm_eps));
    attention = register_module("attention", Attention(c));
    ffn_norm = register_module("ffn_norm", RMSNorm(c.dim, c.norm_eps));
    feed_forward = register_module("feed_forward", FeedForward(c.dim, c.ffn_dim));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
    torch::Tensor h = x + attention(attention_norm(x), cos, sin);
    return h + feed_forward(ffn_norm(h));
  }
  RMSNorm attention_norm{nullptr}, ffn_norm{nullptr};
  Attention attention{nullptr};
  FeedForward feed_forward{nullptr};
};
TORCH_MODULE(Block);

// The decoder. Construction initializes like torchtitan's Llama: embeddings N(0, 1), attention
// and feed-forward projections truncated-normal with std 0.02 (output projections scaled by
// depth), and the RoPE tables as buffers.
class LlamaImpl : public torch::nn::Module {
 public:
  explicit LlamaImpl(const LlamaConfig& c) : config(c) {
    tok_embeddings = register_module("tok_embeddings", torch::nn::Embedding(c.vocab_size, c.dim));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layers; ++i) {
      layers->push_back(Block(c));
    }
    norm = register_module("norm", RMSNorm(c.dim, c.norm_eps));
    output = register_module(
        "output", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.vocab_size).bias(false)));
    const torch::Tensor inv_freq =
        1.0 / torch::pow(c.rope_theta, torch::arange(0, c.head_dim(), 2, torch::kDouble) /
                                           static_cast<double>(c.head_dim()));
    const torch::Tensor angles =
        torch::outer(torch::arange(c.max_seq_len, torch::kDouble), inv_freq).to(torch::kFloat);
    rope_cos = register_buffer("rope_cos", angles.cos());
    rope_sin = register_buffer("rope_sin", angles.sin());
    init_weights();
  }

  torch::Tensor forward(const torch::Tensor& tokens) {
    torch::Tensor h = tok_embeddings(tokens);
    for (const auto& layer : *layers) {
      h = layer->as<Block>()->forward(h, rope_cos, rope_sin);
    }
    return output(norm(h));
  }

  LlamaConfig config;
  torch::nn::Embedding tok_embeddings{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear output{nullptr};
  torch::Tensor rope_cos, rope_sin;

 private:
  void init_weights() {
    torch::NoGradGuard no_grad;
    tok_embeddings->weight.normal_();
    const double depth_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layers));
    for (const auto& layer : *layers) {
      auto* block = layer->as<Block>();
      for (auto* linear : {&block->attention->wq, &block->attention->wk, &block->attention->wv,
                           &block->feed_forward->w1}) {
        trunc_normal_((*linear)->weight, 0.02, -0.04, 0.04);
      }
      for (auto* linear :
           {&block->attention->wo, &block->feed_forward->w2, &block->feed_forward->w3}) {
        trunc_normal_((*linear)->weight, depth_std, -2 * depth_std, 2 * depth_std);
      }
    }
    const double final_std = 1.0 / std::sqrt(static_cast<double>(config.dim));
    trunc_normal_(output->weight, final_std, -3 * final_std, 3 * final_std);
  }
};
TORCH_MODULE(Llama);

}  // namespace torchdefer::models
