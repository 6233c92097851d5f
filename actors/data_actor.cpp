// The data actor (actors/data_actor.h).
#include "actors/data_actor.h"

#include <algorithm>
#include <memory>
#include <string>

#include "actors/messages.h"

namespace troupe {

DataActor::behavior_type data_actor(DataActor::pointer self, JobContext ctx, std::vector<std::vector<WorkerActor>> firsts,
                                    std::vector<std::vector<WorkerActor>> lasts, int M, int B, int T,
                                    CoordinatorActor coordinator) {
  return {
      [=](batch_atom, int64_t k, int kind, int64_t index) {
        const int DP = (int)firsts.size();
        const int Bm = B / DP / M;
        try {
          std::vector<int32_t> in((size_t)B * T), tg((size_t)B * T);
          ctx.fill_batch(kind, index, B, T, in.data(), tg.data());
          // the loss is the mean over the global batch's real (not ignored, -1) target tokens
          const int64_t real = std::count_if(tg.begin(), tg.end(), [](int32_t t) { return t >= 0; });
          const float dloss = real > 0 ? 1.0f / (float)real : 0.0f;
          for (int d = 0; d < DP; ++d)
            for (int m = 0; m < M; ++m) {
              const size_t off = ((size_t)d * M + m) * Bm * T, n = (size_t)Bm * T;
              auto ib = std::make_shared<std::vector<int32_t>>(in.begin() + off, in.begin() + off + n);
              auto tb = std::make_shared<std::vector<int32_t>>(tg.begin() + off, tg.begin() + off + n);
              for (auto& f : firsts[d]) self->send(f, tokens_atom::value, k, m, TokenBlock{ib, Bm, T});
              for (auto& l : lasts[d]) self->send(l, targets_atom::value, k, m, TokenBlock{tb, Bm, T, dloss});
            }
        } catch (const UserError& e) {  // the data's fault (a token file changed under the run): exit 2
          self->send(coordinator, fail_atom::value, kFailUserInput, std::string(e.what()));
        } catch (const std::exception& e) {
          self->send(coordinator, fail_atom::value, -1, std::string("data actor: ") + e.what());
        }
      },
      [=](stop_atom) { self->quit(); },
  };
}

}  // namespace troupe
