x = """never closed
