// libmlx5.so.1 stand-in: the mlx5 direct-verbs entry points perftest links against. They are only
// reached for mlx5 devices or mlx5-only options (-c DC, --aes_xts); a softrdma device is never
// one, so each fails as libmlx5 does for a non-mlx5 device.

#include <infiniband/mlx5dv.h>

#include <cerrno>
#include <cstddef>

namespace softrdma::stubs {
namespace {

template <typename T>
T *fail_null() noexcept {
  errno = EOPNOTSUPP;
  return nullptr;
}

}  // namespace
}  // namespace softrdma::stubs

using softrdma::stubs::fail_null;

#pragma GCC visibility push(default)
extern "C" {

struct ibv_qp *mlx5dv_create_qp(struct ibv_context *, struct ibv_qp_init_attr_ex *,
                                struct mlx5dv_qp_init_attr *) {
  return fail_null<ibv_qp>();
}

struct ibv_context *mlx5dv_open_device(struct ibv_device *, struct mlx5dv_context_attr *) {
  return fail_null<ibv_context>();
}

int mlx5dv_devx_general_cmd(struct ibv_context *, const void *, size_t, void *, size_t) {
  return EOPNOTSUPP;
}

struct mlx5dv_mkey *mlx5dv_create_mkey(struct mlx5dv_mkey_init_attr *) {
  return fail_null<mlx5dv_mkey>();
}

int mlx5dv_destroy_mkey(struct mlx5dv_mkey *) { return EOPNOTSUPP; }

struct mlx5dv_qp_ex *mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex *) {
  return fail_null<mlx5dv_qp_ex>();
}

int mlx5dv_crypto_login(struct ibv_context *, struct mlx5dv_crypto_login_attr *) {
  return EOPNOTSUPP;
}

struct mlx5dv_dek *mlx5dv_dek_create(struct ibv_context *, struct mlx5dv_dek_init_attr *) {
  return fail_null<mlx5dv_dek>();
}

int mlx5dv_dek_destroy(struct mlx5dv_dek *) { return EOPNOTSUPP; }

}  // extern "C"
#pragma GCC visibility pop
