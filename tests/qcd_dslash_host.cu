// Runs the per-site functions of src/circuslink/apps/qcd/dslash.cu on the host, over a whole local lattice,
// so that tests/test_qcd_kernels.py can compare them with the numpy implementation on machines without a GPU.
//
//   qcd_dslash_host DIR    reads DIR/{job.txt, args.bin, in.bin, x.bin, out.bin, gauge.bin, ghost.bin,
//                          send.bin, sites.bin}, writes DIR/out.bin and DIR/send.bin.
// job.txt: "MODE PREC BETA" with MODE interior | interior2 | interior4 | interior8 (the split hop) | exterior |
// whole | whole2 | whole4 | whole8 (the one-pass hop) | xpay | pack, PREC f | d; or MODE fold | newres (the
// resident CG's reliable update in single and double, PREC ignored): fold adds x (single) into out (double,
// y) and zeroes x; newres takes in (double, the new residual) into out (single, p) and x (single, r_s).
// x.bin is written back too.
// args.bin: a DslashArgs as the host's ABI table packs it (pointers are set here); its size is checked.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dslash.cu"

using circuslink::qcd::DslashArgs;

static std::vector<char> slurp(const std::string& path) {
  std::vector<char> data;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    std::fprintf(stderr, "cannot open %s\n", path.c_str());
    std::exit(2);
  }
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + n);
  std::fclose(f);
  return data;
}

static void dump(const std::string& path, const std::vector<char>& data) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data.data(), 1, data.size(), f) != data.size()) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(2);
  }
  std::fclose(f);
}

template <typename R>
static void run(const std::string& mode, DslashArgs& A, double beta) {
  if (mode == "interior") {
    for (int cb = 0; cb < A.vh; ++cb) circuslink::qcd::interior_site<R>(A, cb);
  } else if (mode == "interior2" || mode == "interior4" || mode == "interior8") {
    // The split hop's parts, as its lanes compute them (directions part, part + split, ...), added in part
    // order here where the GPU adds them in a butterfly, and each part's share of the stores.
    const int split = std::atoi(mode.c_str() + 8);
    for (int cb = 0; cb < A.vh; ++cb) {
      const circuslink::qcd::Where w = circuslink::qcd::where(A, cb, A.parity);
      circuslink::qcd::Spinor<R> total, acc;
      circuslink::qcd::interior_part<R, true>(A, w, cb, 0, split, total);
      for (int part = 1; part < split; ++part) {
        circuslink::qcd::interior_part<R, true>(A, w, cb, part, split, acc);
        for (int k = 0; k < 12; ++k) total.c[k] = total.c[k] + acc.c[k];
      }
      for (int part = 0; part < split; ++part) circuslink::qcd::interior_finish<R, true>(A, cb, total, part, split);
    }
  } else if (mode == "whole" || mode == "whole2" || mode == "whole4" || mode == "whole8") {
    // The resident CG's one-pass hop (direct faces): every site's directions with the ghosts' terms inline, the
    // lanes' parts added in part order (a butterfly on the GPU), then each part's end (whole_hop_finish).
    const int split = mode.size() > 5 ? std::atoi(mode.c_str() + 5) : 1;
    for (int cb = 0; cb < A.vh; ++cb) {
      const circuslink::qcd::Where w = circuslink::qcd::where(A, cb, A.parity);
      circuslink::qcd::Spinor<R> total, acc;
      circuslink::qcd::interior_part<R, false, true>(A, w, cb, 0, split, total);
      for (int part = 1; part < split; ++part) {
        circuslink::qcd::interior_part<R, false, true>(A, w, cb, part, split, acc);
        for (int k = 0; k < 12; ++k) total.c[k] = total.c[k] + acc.c[k];
      }
      for (int part = 0; part < split; ++part) circuslink::qcd::whole_hop_finish<R>(A, cb, w, total, part, split);
    }
  } else if (mode == "exterior") {
    for (int j = 0; j < A.n_sites; ++j) circuslink::qcd::exterior_site<R>(A, A.sites[j]);
  } else if (mode == "xpay") {
    for (int cb = 0; cb < A.vh; ++cb) circuslink::qcd::xpay_pack_site<R>(A, cb, beta);
  } else if (mode == "pack") {
    for (int j = 0; j < A.n_sites; ++j) circuslink::qcd::xpay_pack_site<R>(A, A.sites[j], beta);
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    std::exit(2);
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  char mode[32], prec[8];
  double beta = 0;
  {
    std::vector<char> job = slurp(dir + "/job.txt");
    job.push_back('\0');
    if (std::sscanf(job.data(), "%31s %7s %lf", mode, prec, &beta) != 3) {
      std::fprintf(stderr, "bad job.txt\n");
      return 2;
    }
  }
  std::vector<char> raw = slurp(dir + "/args.bin");
  if (raw.size() != sizeof(DslashArgs)) {
    std::fprintf(stderr, "args.bin has %zu bytes, sizeof(DslashArgs) is %zu\n", raw.size(), sizeof(DslashArgs));
    return 3;
  }
  DslashArgs A;
  std::memcpy(&A, raw.data(), sizeof A);
  std::vector<char> in = slurp(dir + "/in.bin"), x = slurp(dir + "/x.bin"), out = slurp(dir + "/out.bin");
  std::vector<char> gauge = slurp(dir + "/gauge.bin"), ghost = slurp(dir + "/ghost.bin"), send = slurp(dir + "/send.bin");
  std::vector<char> sites = slurp(dir + "/sites.bin");
  A.in = in.data();
  A.x = A.has_x ? x.data() : nullptr;
  A.out = out.data();
  A.gauge = gauge.data();
  A.ghost = ghost.data();
  A.send = send.data();
  for (void*& to : A.face_to) to = A.send;  // every slot's faces into the send array, as the host's copies expect
  A.sites = reinterpret_cast<const int*>(sites.data());
  if (std::string(mode) == "pack") A.in = A.out;  // the packed field
  if (std::string(mode) == "fold") {
    for (int cb = 0; cb < A.vh; ++cb) circuslink::qcd::fold_site<float, double>(A, reinterpret_cast<float*>(x.data()), cb);
  } else if (std::string(mode) == "newres") {
    for (int cb = 0; cb < A.vh; ++cb)
      circuslink::qcd::new_residual_site<float, double>(A, reinterpret_cast<const double*>(in.data()), cb);
  } else if (std::string(prec) == "f") {
    run<float>(mode, A, beta);
  } else {
    run<double>(mode, A, beta);
  }
  dump(dir + "/out.bin", out);
  dump(dir + "/send.bin", send);
  dump(dir + "/x.bin", x);
  return 0;
}
