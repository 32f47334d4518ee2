"""Applications built on circuslink's primitives: lattice QCD (``apps.qcd``) and the distributed 2-D FFT
(``apps.fft``), the layer above rma, channels and collectives."""
