"""VoxCPM2 (form C): a MiniCPM4 language model whose every step also runs a local diffusion
transformer (the side module) that writes the next patch of continuous audio latents, which a
local encoder feeds back; an AudioVAE decodes the latents to audio."""
