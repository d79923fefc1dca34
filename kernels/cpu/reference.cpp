#include "cpu/reference.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>

namespace caf_serving::kernels::ref {

float activate(activation act, float x, activation_params params) {
  double xd = x, alpha = params.alpha, beta = params.beta;
  auto clamp01 = [](double v) { return std::min(std::max(v, 0.0), 1.0); };
  auto sigmoid = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  switch (act) {
    case activation::none:
      return x;
    case activation::relu:
      return x > 0.0f ? x : 0.0f;
    case activation::gelu_erf:
      return static_cast<float>(0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))));
    case activation::gelu_tanh: {
      double inner = std::sqrt(2.0 / M_PI) * (xd + 0.044715 * xd * xd * xd);
      return static_cast<float>(0.5 * xd * (1.0 + std::tanh(inner)));
    }
    case activation::tanh:
      return static_cast<float>(std::tanh(xd));
    case activation::sigmoid:
      return static_cast<float>(sigmoid(xd));
    case activation::clip:
      return std::min(std::max(x, params.alpha), params.beta);
    case activation::hard_swish:
      return static_cast<float>(xd * clamp01(alpha * xd + beta));
    case activation::hard_sigmoid:
      return static_cast<float>(clamp01(alpha * xd + beta));
    case activation::swish:
      return static_cast<float>(xd * sigmoid(alpha * xd));
    case activation::leaky_relu:
      return static_cast<float>(xd >= 0.0 ? xd : alpha * xd);
  }
  return x;
}

std::vector<float> add_bias(const std::vector<float>& x,
                            const std::vector<float>& bias, bias_layout layout) {
  assert(bias.size() == layout.channels);
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    out[i] = x[i] + bias[(i / layout.inner) % layout.channels];
  return out;
}

std::vector<float> apply_activation(const std::vector<float>& x, activation act,
                                    activation_params params) {
  std::vector<float> out(x.size());
  std::transform(x.begin(), x.end(), out.begin(),
                 [act, params](float v) { return activate(act, v, params); });
  return out;
}

std::vector<float> add(const std::vector<float>& a, const std::vector<float>& b) {
  assert(a.size() == b.size());
  std::vector<float> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    out[i] = a[i] + b[i];
  return out;
}

std::vector<float> layer_norm(const std::vector<float>& x, row_shape shape,
                              const std::vector<float>& gamma,
                              const std::vector<float>& beta, float eps) {
  assert(x.size() == shape.rows * shape.cols);
  std::vector<float> out(x.size());
  for (std::size_t r = 0; r < shape.rows; ++r) {
    const float* row = x.data() + r * shape.cols;
    double mean = 0;
    for (std::size_t c = 0; c < shape.cols; ++c)
      mean += row[c];
    mean /= static_cast<double>(shape.cols);
    double var = 0;
    for (std::size_t c = 0; c < shape.cols; ++c)
      var += (row[c] - mean) * (row[c] - mean);
    var /= static_cast<double>(shape.cols);
    double inv_std = 1.0 / std::sqrt(var + eps);
    for (std::size_t c = 0; c < shape.cols; ++c)
      out[r * shape.cols + c]
        = static_cast<float>((row[c] - mean) * inv_std * gamma[c] + beta[c]);
  }
  return out;
}

std::vector<float> softmax(const std::vector<float>& x, row_shape shape,
                           const softmax_mask& mask) {
  assert(x.size() == shape.rows * shape.cols);
  std::vector<float> out(x.size());
  std::vector<double> logits(shape.cols);
  constexpr double neg_inf = -std::numeric_limits<double>::infinity();
  for (std::size_t r = 0; r < shape.rows; ++r) {
    std::size_t mask_row = mask_row_offset(mask.layout, mask.mask_rows, shape.cols, r);
    double max = neg_inf;
    for (std::size_t c = 0; c < shape.cols; ++c) {
      double v = x[r * shape.cols + c];
      if (mask.kind == mask_kind::additive)
        v += mask.additive[mask_row + c];
      else if (mask.kind == mask_kind::boolean && mask.keep[mask_row + c] == 0)
        v = neg_inf;
      logits[c] = v;
      max = std::max(max, v);
    }
    double sum = 0;
    for (std::size_t c = 0; c < shape.cols; ++c) {
      logits[c] = max == neg_inf ? 0.0 : std::exp(logits[c] - max);
      sum += logits[c];
    }
    for (std::size_t c = 0; c < shape.cols; ++c)
      out[r * shape.cols + c] = sum > 0 ? static_cast<float>(logits[c] / sum) : 0.0f;
  }
  return out;
}

std::vector<float> matmul(const std::vector<float>& a, const std::vector<float>& b,
                          matmul_shape s) {
  assert(a.size() == s.m * s.k && b.size() == s.k * s.n);
  std::vector<float> out(s.m * s.n);
  for (std::size_t i = 0; i < s.m; ++i)
    for (std::size_t j = 0; j < s.n; ++j) {
      double acc = 0;
      for (std::size_t p = 0; p < s.k; ++p)
        acc += static_cast<double>(a[i * s.k + p])
               * (s.b_transposed ? b[j * s.k + p] : b[p * s.n + j]);
      out[i * s.n + j] = static_cast<float>(acc);
    }
  return out;
}

std::vector<float> scale(const std::vector<float>& x, float s) {
  std::vector<float> out(x.size());
  std::transform(x.begin(), x.end(), out.begin(), [s](float v) { return v * s; });
  return out;
}

std::vector<float> attention(const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, attention_shape s,
                             const attention_masks& masks, float softmax_scale) {
  std::size_t head_elems = s.seq * s.head_dim;
  assert(q.size() == s.batch * s.heads * head_elems);
  assert(masks.key_lengths.empty() || masks.key_lengths.size() == s.batch);
  std::vector<float> out(q.size());
  for (std::size_t b = 0; b < s.batch; ++b) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      // This pair's mask as a [seq, seq] additive one: the additive mask's rows,
      // and -inf past the key length.
      softmax_mask mask;
      if (!masks.key_lengths.empty() || !masks.additive.empty()) {
        mask.kind = mask_kind::additive;
        mask.mask_rows = s.seq;
        mask.additive.assign(s.seq * s.seq, 0.0f);
        for (std::size_t i = 0; i < s.seq; ++i)
          for (std::size_t j = 0; j < s.seq; ++j) {
            float& m = mask.additive[i * s.seq + j];
            if (!masks.additive.empty())
              m = masks.additive[b * masks.batch + h * masks.head + i * masks.query + j];
            if (!masks.key_lengths.empty() && static_cast<int>(j) >= masks.key_lengths[b])
              m = -std::numeric_limits<float>::infinity();
          }
      }
      std::size_t offset = (b * s.heads + h) * head_elems;
      auto slice = [&](const std::vector<float>& t) {
        return std::vector<float>(t.begin() + offset, t.begin() + offset + head_elems);
      };
      auto scores = matmul(slice(q), slice(k), {s.seq, s.seq, s.head_dim, true});
      auto probs = softmax(scale(scores, softmax_scale), {s.seq, s.seq}, mask);
      auto o = matmul(probs, slice(v), {s.seq, s.head_dim, s.seq, false});
      std::copy(o.begin(), o.end(), out.begin() + offset);
    }
  }
  return out;
}

std::vector<std::uint8_t> gather(const std::vector<std::vector<std::uint8_t>>& requests) {
  std::vector<std::uint8_t> batch;
  for (const auto& r : requests)
    batch.insert(batch.end(), r.begin(), r.end());
  return batch;
}

std::vector<std::vector<std::uint8_t>> scatter(const std::vector<std::uint8_t>& batch,
                                               const std::vector<std::size_t>& sizes) {
  std::vector<std::vector<std::uint8_t>> out;
  std::size_t offset = 0;
  for (auto size : sizes) {
    assert(offset + size <= batch.size());
    out.emplace_back(batch.begin() + offset, batch.begin() + offset + size);
    offset += size;
  }
  return out;
}

std::vector<top_k_row> softmax_top_k(const std::vector<float>& logits, row_shape shape,
                                     std::size_t k) {
  assert(k <= shape.cols);
  auto probs = softmax(logits, shape, softmax_mask{});
  std::vector<top_k_row> out(shape.rows);
  std::vector<std::int32_t> order(shape.cols);
  for (std::size_t r = 0; r < shape.rows; ++r) {
    const float* row = probs.data() + r * shape.cols;
    const float* raw = logits.data() + r * shape.cols;
    std::iota(order.begin(), order.end(), 0);
    // Rank by the logits, which order exactly like the probabilities but without
    // the rounding that can make two different logits equal probabilities.
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k),
                      order.end(), [raw](std::int32_t a, std::int32_t b) {
                        return raw[a] > raw[b] || (raw[a] == raw[b] && a < b);
                      });
    for (std::size_t i = 0; i < k; ++i) {
      out[r].indices.push_back(order[i]);
      out[r].probabilities.push_back(row[order[i]]);
    }
  }
  return out;
}

} // namespace caf_serving::kernels::ref
