"""Applications built on circuslink's primitives: the distributed 2-D FFT (``circuslink.apps.fft``)."""
