#include "compress/calibration.h"

#include <cmath>
#include <stdexcept>

#include "gguf/gguf.h"

namespace kvpack::compress {

Calibrator::Calibrator(const ModelConfig& c) : c_(c), bands_(c.rope_dims / 2) {
  const size_t n = static_cast<size_t>(c.n_layer) * c.n_head * bands_;
  sum_re_.assign(n, 0);
  sum_im_.assign(n, 0);
  sum_abs_.assign(n, 0);
  count_.assign(static_cast<size_t>(c.n_layer), 0);
}

void Calibrator::on_query_pre_rope(int32_t, int32_t layer, const float* q, int32_t n_tokens, int64_t stride) {
  for (int32_t t = 0; t < n_tokens; ++t) {
    for (int32_t h = 0; h < c_.n_head; ++h) {
      const float* qh = q + t * stride + static_cast<int64_t>(h) * c_.head_dim;
      const size_t base = (static_cast<size_t>(layer) * c_.n_head + h) * bands_;
      for (int32_t f = 0; f < bands_; ++f) {
        const double re = qh[band_re(f, bands_, c_.rope_neox)], im = qh[band_im(f, bands_, c_.rope_neox)];
        sum_re_[base + f] += re;
        sum_im_[base + f] += im;
        sum_abs_[base + f] += std::sqrt(re * re + im * im);
      }
    }
  }
  count_[static_cast<size_t>(layer)] += n_tokens;
}

QueryStats Calibrator::finish() const {
  if (count_.empty() || count_[0] == 0) throw std::runtime_error("calibration saw no tokens");
  QueryStats s;
  s.n_layer = c_.n_layer;
  s.n_head = c_.n_head;
  s.n_bands = bands_;
  s.rope_neox = c_.rope_neox;
  s.model_name = c_.name;
  s.tokens = count_[0];
  const size_t n = sum_re_.size();
  s.mean_re.resize(n);
  s.mean_im.resize(n);
  s.abs_mean.resize(n);
  const size_t per_layer = static_cast<size_t>(c_.n_head) * bands_;
  for (size_t i = 0; i < n; ++i) {
    const double cnt = static_cast<double>(count_[i / per_layer]);
    s.mean_re[i] = static_cast<float>(sum_re_[i] / cnt);
    s.mean_im[i] = static_cast<float>(sum_im_[i] / cnt);
    s.abs_mean[i] = static_cast<float>(sum_abs_[i] / cnt);
  }
  return s;
}

void QueryStats::save(const std::string& path) const {
  gguf::Writer w;
  w.set_string("general.architecture", "kvpack-calibration");
  w.set_u32("kvpack.calib.version", 1);
  w.set_string("kvpack.calib.model", model_name);
  w.set_u32("kvpack.calib.n_layer", static_cast<uint32_t>(n_layer));
  w.set_u32("kvpack.calib.n_head", static_cast<uint32_t>(n_head));
  w.set_u32("kvpack.calib.n_bands", static_cast<uint32_t>(n_bands));
  w.set_bool("kvpack.calib.rope_neox", rope_neox);
  w.set_u64("kvpack.calib.tokens", static_cast<uint64_t>(tokens));
  const std::vector<uint64_t> shape = {static_cast<uint64_t>(n_bands), static_cast<uint64_t>(n_head), static_cast<uint64_t>(n_layer)};
  w.add_tensor("q_mean_re", shape, DType::F32, mean_re.data(), mean_re.size() * 4);
  w.add_tensor("q_mean_im", shape, DType::F32, mean_im.data(), mean_im.size() * 4);
  w.add_tensor("q_abs_mean", shape, DType::F32, abs_mean.data(), abs_mean.size() * 4);
  w.write(path);
}

QueryStats QueryStats::load(const std::string& path, const ModelConfig& c) {
  std::unique_ptr<gguf::File> f;
  try {
    f = gguf::File::open(path);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("calibration file: ") + e.what());
  }
  if (f->get_string("general.architecture").value_or("") != "kvpack-calibration")
    throw std::runtime_error(path + ": not a kvpack calibration file (make one with `kvpack calibrate`)");
  QueryStats s;
  s.n_layer = static_cast<int32_t>(f->get_int("kvpack.calib.n_layer").value_or(-1));
  s.n_head = static_cast<int32_t>(f->get_int("kvpack.calib.n_head").value_or(-1));
  s.n_bands = static_cast<int32_t>(f->get_int("kvpack.calib.n_bands").value_or(-1));
  s.rope_neox = f->get_bool("kvpack.calib.rope_neox").value_or(false);
  s.model_name = f->get_string("kvpack.calib.model").value_or("");
  s.tokens = f->get_int("kvpack.calib.tokens").value_or(0);
  if (s.n_layer != c.n_layer || s.n_head != c.n_head || s.n_bands != c.rope_dims / 2 || s.rope_neox != c.rope_neox)
    throw std::runtime_error(path + ": calibration is for a different model shape (" + std::to_string(s.n_layer) + " layers, " +
                             std::to_string(s.n_head) + " heads, " + std::to_string(s.n_bands) + " bands; model has " +
                             std::to_string(c.n_layer) + ", " + std::to_string(c.n_head) + ", " + std::to_string(c.rope_dims / 2) + ")");
  const size_t n = static_cast<size_t>(s.n_layer) * s.n_head * s.n_bands;
  auto take = [&](const char* name, std::vector<float>& out) {
    const gguf::TensorInfo* t = f->tensor(name);
    if (t == nullptr || t->type != DType::F32 || t->n_elements != n)
      throw std::runtime_error(path + ": missing or malformed tensor '" + name + "'");
    const auto* p = static_cast<const float*>(t->data);
    out.assign(p, p + n);
  };
  take("q_mean_re", s.mean_re);
  take("q_mean_im", s.mean_im);
  take("q_abs_mean", s.abs_mean);
  return s;
}

}  // namespace kvpack::compress
