# café
x = 'é'
