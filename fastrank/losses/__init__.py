"""fastrank.losses"""
