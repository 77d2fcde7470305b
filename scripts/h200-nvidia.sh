# Sourced on the NVIDIA machine: link_nvidia DIR puts `nvidia` (the CUDA 13
# nvidia-* wheels) beside DIR/mlx, where libmlx's RPATH (../../nvidia) looks.
# Torch's nvidia folder has them, but its cu13/include lacks crt/ (which MLX's
# run-time compiled quantized matmuls include): overlay it from the CUDA
# toolkit when the toolkit has it.
link_nvidia() {
  local dir=$1 torch_nvidia crt entry
  torch_nvidia=$(python3 -c 'import nvidia; print(nvidia.__path__[0])')
  crt=/usr/local/cuda/targets/x86_64-linux/include/crt
  [ -d "$crt" ] || crt=$(ls -d /usr/local/cuda-*/targets/x86_64-linux/include/crt 2>/dev/null | head -1)
  rm -rf "${dir:?}/nvidia"
  if [ -z "$crt" ] || [ -d "$torch_nvidia/cu13/include/crt" ]; then
    ln -sfn "$torch_nvidia" "$dir/nvidia"; return
  fi
  mkdir -p "$dir/nvidia/cu13/include"
  for entry in "$torch_nvidia"/*; do [ "$(basename "$entry")" = cu13 ] || ln -sfn "$entry" "$dir/nvidia/"; done
  for entry in "$torch_nvidia"/cu13/*; do [ "$(basename "$entry")" = include ] || ln -sfn "$entry" "$dir/nvidia/cu13/"; done
  for entry in "$torch_nvidia"/cu13/include/*; do ln -sfn "$entry" "$dir/nvidia/cu13/include/"; done
  ln -sfn "$crt" "$dir/nvidia/cu13/include/crt"
}
