#pragma once
template <typename T>
__device__ __forceinline__ T scale(T v, int n) { return v * (T)n; }
