"""The processes an `exitwatch run` left running when its wrapper died."""
